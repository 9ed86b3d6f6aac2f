"""Teaching is per course: an Instructor of one LMS course who is a Learner in another is that
other course's student (no changing its classes, no granting hours, its budget binds them, no
seeing its students' usage or seats); a local course keeps the rule of the instructor role."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.utils import timezone
from lti_tool.models import LtiContext, LtiDeployment, LtiMembership, LtiRegistration, LtiUser

from accounts import access
from classes import budget, services
from lti.models import LtiCourse
from reservations import blocks, showback, visibility
from reservations.models import Reservation

pytestmark = pytest.mark.django_db


@pytest.fixture
def lms(db):
    registration = LtiRegistration.objects.create(
        name="lms", issuer="https://lms.example", client_id="tool", auth_url="https://lms.example/auth",
        token_url="https://lms.example/token",  # noqa: S106 (a URL) keyset_url="https://lms.example/jwks",
    )  # fmt: skip
    deployment = LtiDeployment.objects.create(registration=registration, deployment_id="d1", is_active=True)
    return registration, deployment


def lms_course(lms, context_id):
    registration, deployment = lms
    group = Group.objects.create(name=f"lms-{context_id}")
    LtiCourse.objects.create(registration=registration, context_id=context_id, group=group)
    return group, LtiContext.objects.create(deployment=deployment, id_on_platform=context_id)


def launched(lms, user, group, context, *, instructor):
    """What a launch of ``user`` into ``context`` leaves: the group, django-lti's membership."""
    lti_user, _ = LtiUser.objects.get_or_create(registration=lms[0], sub=user.username, defaults={"auth_user": user})
    LtiMembership.objects.create(user=lti_user, context=context, is_instructor=instructor, is_learner=not instructor)
    group.user_set.add(user)
    if instructor:
        access.set_roles(user, ["instructor"], actor=user)


def test_an_instructor_of_one_lms_course_is_a_student_of_another(lms, sim_host, image, term, bob, django_user_model):
    carol = django_user_model.objects.create_user("carol")
    taught, taught_context = lms_course(lms, "a")
    learnt, learnt_context = lms_course(lms, "b")
    launched(lms, carol, taught, taught_context, instructor=True)
    launched(lms, carol, learnt, learnt_context, instructor=False)
    launched(lms, bob, learnt, learnt_context, instructor=False)
    klass = services.create_class(actor="test", course=learnt, name="Lab B", image=image, hours_budget=5, **term)

    assert services.teaches(carol, taught) and not services.teaches(carol, learnt)
    assert klass not in services.managed_classes(carol)
    assert klass.pk not in showback.visible_usage(carol).class_ids
    with pytest.raises(PermissionDenied):
        services.change_class(klass, actor=carol, by=carol, name="mine now")
    with pytest.raises(PermissionDenied):
        budget.grant_hours(klass, bob, 10, "because", actor=carol, by=carol)
    assert list(budget.students(klass)) == [bob, carol]
    assert klass in budget.studied(carol, image)  # so its hours budget binds her
    # Nor the course's blocks (its sessions' seats are some): not seen, not managed, none made.
    assert Reservation.objects.filter(block__group=learnt, user=bob).exists()
    assert not visibility.visible(carol).filter(user=bob).exists()
    assert not blocks.managed_blocks(carol).filter(group=learnt).exists()
    assert not access.can_manage_block(carol, Reservation.objects.filter(block__group=learnt).first().block)
    start = timezone.now() + timedelta(days=1)
    with pytest.raises(PermissionDenied):
        blocks.create_block(
            actor=carol, created_by=carol, name="mine", image=image, group=learnt, seats=1, start=start,
            end=start + timedelta(hours=1),
        )  # fmt: skip


def test_a_local_course_keeps_the_instructor_role_rule(lms, sim_host, image, term, course, instructor, student):
    klass = services.create_class(actor="test", course=course, name="Lab", image=image, **term)
    assert services.teaches(instructor, course) and not services.teaches(student, course)
    assert klass in services.managed_classes(instructor)
    assert list(budget.students(klass)) == [student]


def test_the_lms_instructor_runs_their_own_course(lms, sim_host, image, term, django_user_model, bob):
    dora = django_user_model.objects.create_user("dora")
    group, context = lms_course(lms, "c")
    launched(lms, dora, group, context, instructor=True)
    launched(lms, bob, group, context, instructor=False)
    klass = services.create_class(actor="test", course=group, name="Lab C", image=image, **term)
    assert klass in services.managed_classes(dora) and klass.pk in showback.visible_usage(dora).class_ids
    assert list(budget.students(klass)) == [bob] and not budget.studied(dora).exists()
