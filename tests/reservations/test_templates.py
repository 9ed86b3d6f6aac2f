"""An image's template: a maintainer's long-lived VM published as the image's next revision,
tested, made production and rolled back (simulator, jobs in-process)."""

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from accounts import access
from core.errors import Conflict
from jobs.models import Job
from provisioning import quotas, revisions
from provisioning import services as vms
from provisioning.models import VM, QuotaRule
from reservations import services, templates
from reservations.models import IdlePolicy, Reservation


def fresh(reservation):
    return Reservation.objects.select_related("vm", "vm__revision").get(pk=reservation.pk)


def ready(reservation, sync_jobs):
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ready", reservation.error
    return reservation


@pytest.fixture
def template(sim_host, image, maya, sync_jobs):
    return ready(services.start_template(image, actor=maya), sync_jobs)


def publish(template, sync_jobs, actor, **options):
    job = services.publish(template, actor=actor, comment="new tools", **options)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "success", job.error_message
    return job


def test_the_whole_loop_publish_test_promote_and_roll_back(template, image, maya, student, sync_jobs):
    first = revisions.production(image)
    assert template.template_of == image and template.vm.revision == first

    job = publish(template, sync_jobs, maya)
    second = image.revisions.get(number=2)
    assert job.result["revision"] == 2 and second.state == "testing"
    assert (second.parent, second.comment) == (first, "new tools")
    assert revisions.production(image) == first
    assert fresh(template).status == "ended"  # published: its VM torn down
    assert VM.objects.get(pk=template.vm_id).state == "destroyed"
    assert image.variants.filter(revision=second).get().location.endswith(f"/captured/debian-12-r2-t{template.pk}")

    tried = ready(services.test_revision(image, second, actor=maya), sync_jobs)
    assert tried.revision == second and tried.vm.revision == second
    meanwhile = ready(services.reserve(student, image, actor=student, duration=timedelta(hours=1)), sync_jobs)
    assert meanwhile.vm.revision == first  # students get production while it is tested

    revisions.make_production(second, actor=maya)
    running = ready(services.reserve(student, image, actor=student, duration=timedelta(hours=1)), sync_jobs)
    assert running.vm.revision == second

    revisions.make_production(first, actor=maya)  # the roll-back
    after = ready(services.reserve(student, image, actor=student, duration=timedelta(hours=1)), sync_jobs)
    assert after.vm.revision == first
    assert fresh(running).vm.revision == second  # a running one keeps its revision


def test_it_publishes_straight_to_production_and_can_keep_the_template(template, image, maya, sync_jobs):
    publish(template, sync_jobs, maya, production=True, keep=True)
    second = revisions.production(image)
    assert second.number == 2 and image.revisions.get(number=1).state == "testing"
    kept = fresh(template)
    assert kept.status == "ready" and kept.vm.state == "stopped"  # the capture stopped it; it goes on
    assert services.open_template(image) == kept


def test_a_template_starts_from_a_chosen_revision(sim_host, image, maya, sync_jobs):
    second = vms.add_revision(
        image, actor="test", variants=[{"hypervisor_type": "sim", "format": "sim", "location": "sim://library/v2"}]
    )
    template = ready(services.start_template(image, revision=second, actor=maya), sync_jobs)
    assert template.revision == second and template.vm.revision == second


def test_it_refuses_a_second_publish_while_one_is_under_way(template, image, maya, sync_jobs):
    services.publish(template, actor=maya)
    with pytest.raises(Conflict, match="is being published already"):
        services.publish(template, actor=maya, production=True)
    sync_jobs.drain()
    assert list(image.revisions.values_list("number", "state")) == [(1, "production"), (2, "testing")]


def test_discard_ends_the_template_without_a_revision(template, image, maya, sync_jobs):
    services.discard(template, actor=maya)
    sync_jobs.drain()
    assert fresh(template).status == "ended" and image.revisions.count() == 1
    assert services.open_template(image) is None


def test_it_refuses_a_second_template_of_one_image(template, image, admin_user):
    with pytest.raises(Conflict, match=r"debian-12 has a template already .*publish or discard it first"):
        services.start_template(image, actor=admin_user)


def test_it_refuses_a_user_who_does_not_maintain_the_image(sim_host, image, student, django_user_model, template):
    stranger = django_user_model.objects.create_user("sam")
    access.set_roles(stranger, ["image-maintainer"], actor="test")  # a maintainer, of no group of this image
    for user in (student, stranger):
        with pytest.raises(PermissionDenied):
            services.start_template(image, actor=user)
        with pytest.raises(PermissionDenied):
            services.publish(template, actor=user)
        with pytest.raises(PermissionDenied):
            services.discard(template, actor=user)
        with pytest.raises(PermissionDenied):
            services.test_revision(image, revisions.production(image), actor=user)
    assert fresh(template).status == "ready"


def test_it_refuses_to_publish_a_reservation_that_is_not_a_template(sim_host, image, maya, sync_jobs):
    mine = ready(services.reserve(maya, image, actor=maya, duration=timedelta(hours=1)), sync_jobs)
    with pytest.raises(Conflict, match="is not an image's template"):
        services.publish(mine, actor=maya)
    with pytest.raises(Conflict, match="is not an image's template"):
        services.discard(mine, actor=maya)


def test_it_refuses_to_test_a_revision_of_another_image(sim_host, image, maya):
    other = vms.create_image(actor="test", name="other", os="Other")
    vms.add_variant(other, actor="test", hypervisor_type="sim", format="sim", location="sim://library/other")
    with pytest.raises(ValidationError, match="not a revision of debian-12"):
        services.test_revision(image, revisions.production(other), actor=maya)


def test_a_template_does_not_count_against_the_maintainers_quota(template, image, maya, sync_jobs):
    QuotaRule.objects.create(name="one at a time", max_per_user=1)
    hour = (template.start, template.start + timedelta(hours=1))
    assert quotas.held(quotas.Window(*hour, user_id=maya.pk)) == []
    ready(services.reserve(maya, image, actor=maya, duration=timedelta(hours=1)), sync_jobs)  # their one
    with pytest.raises(ValidationError, match="you already have 1 reservation"):
        services.reserve(maya, image, actor=maya, duration=timedelta(hours=1))


def test_a_template_is_extended_past_the_longest_reservation(template):
    longer = template.end + timedelta(days=7)
    assert services.extend(template, longer, actor=template.user).end == longer


def test_a_template_lasts_long_and_is_never_reclaimed_when_idle(sim_host, image, maya, sync_jobs):
    IdlePolicy.objects.create(image=image, no_show_minutes=15, idle_minutes=60)
    template = ready(services.start_template(image, actor=maya), sync_jobs)
    assert template.end - template.start == timedelta(days=templates.TEMPLATE_DAYS)
    assert template.idle_check_at is None and template.idle_deadline is None
    seat = ready(services.reserve(maya, image, actor=maya, duration=timedelta(hours=1)), sync_jobs)
    assert seat.idle_check_at is not None  # the policy applies to the others


def test_the_images_maintainers_see_its_template_and_students_do_not(template, maya, student, django_user_model):
    other = django_user_model.objects.create_user("mo")
    access.set_roles(other, ["image-maintainer"], actor="test")
    other.groups.add(*maya.groups.all())
    assert services.visible(other).filter(pk=template.pk).exists()
    assert not services.visible(student).filter(pk=template.pk).exists()


def test_a_template_of_an_image_reverted_at_its_end_is_never_parked_for_a_student(sim_host, image, maya, sync_jobs):
    vms.update_image(image, actor="test", revert_on_end=True)
    template = ready(services.start_template(image, actor=maya), sync_jobs)
    services.discard(template, actor=maya)
    sync_jobs.drain()
    assert VM.objects.get(pk=template.vm_id).state == "destroyed"
    assert not Job.objects.filter(opcode="vm.park").exists()
