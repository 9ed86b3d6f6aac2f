"""A class that requires approval (or whose image does) waits for an approver: nothing is made
or claimed until then; approved, it is made and its sessions claimed as any class's, and its
instructor is told by mail (a real SMTP server, one for the module)."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from capacity.models import Allocation
from classes import services
from classes.models import Class, Meeting
from provisioning import services as vms
from reservations import approvals
from reservations.models import ApprovalRequest
from tests.images import sim_image
from tests.mailserver import delivered

pytestmark = pytest.mark.django_db


@pytest.fixture
def approver(make_approver, course):
    """carol: an approver in cs101."""
    return make_approver(course)


def make(course, image, term, by, **more):
    return services.create_class(actor=by, by=by, course=course, name="Networks lab", image=image, **term, **more)


def test_a_class_that_requires_approval_is_made_when_approved(
    sim_host, image, course, instructor, student, approver, term, mail
):
    request = make(course, image, term, instructor, requires_approval=True, seats=2)
    assert isinstance(request, ApprovalRequest) and request.kind == "class"
    assert not Class.objects.exists() and not Meeting.objects.exists() and not Allocation.objects.exists()
    assert request.starts_at is not None and request.expires_at <= request.starts_at
    [(subject, _)] = delivered(mail, 1)["carol@example.org"]
    first = f"{request.starts_at:%Y-%m-%d %H:%M} UTC"  # carol has no zone of her own: the site's
    what = "the class Networks lab of cs101 (debian-12, 2 sessions)"
    assert subject == f"Approval wanted: {what}, the first session at {first} for alice"

    request = approvals.approve(request, actor=approver)
    assert request.status == "approved"
    klass = Class.objects.get(pk=request.made_id)
    assert klass.requires_approval and klass.created_by == instructor and klass.meetings.count() == 2
    assert Allocation.objects.filter(released__isnull=True).count() == 4  # two seats a session, claimed now
    [(subject, body)] = delivered(mail, 2)["alice@example.org"]
    assert subject == f"Your request #{request.pk} was approved"
    assert f"the class #{klass.pk} is made and its sessions claimed" in body


def test_a_class_of_an_image_that_requires_approval_waits_and_a_denial_makes_nothing(
    sim_host, image, course, instructor, approver, term, mail
):
    vms.update_image(image, actor="test", requires_approval=True)
    request = make(course, image, term, instructor)
    assert isinstance(request, ApprovalRequest)
    approvals.deny(request, actor=approver, reason="use the lab image")
    assert not Class.objects.exists() and not Allocation.objects.exists()
    mails = delivered(mail, 2)
    assert mails["alice@example.org"][0][0] == f"Your request #{request.pk} was denied"


def test_the_system_and_administrators_make_classes_at_once(sim_host, image, course, admin_user, term):
    vms.update_image(image, actor="test", requires_approval=True)
    assert isinstance(services.create_class(actor="cli", course=course, name="A", image=image, **term), Class)
    assert isinstance(make(course, image, term, admin_user), Class)


def test_the_api_answers_202_with_the_request(sim_host, image, course, instructor, approver, term, api):
    body = {
        "name": "Lab",
        "course": course.pk,
        "image": image.pk,
        "first_day": term["first_day"].isoformat(),
        "last_day": term["last_day"].isoformat(),
        "sessions": [{"weekday": term["first_day"].weekday(), "start": "10:00", "minutes": 60}],
        "time_zone": "UTC",
        "requires_approval": True,
    }
    answer = api(instructor).post("/api/v1/classes/", body, format="json")
    assert answer.status_code == 202, answer.content
    assert answer.json()["kind"] == "class" and answer.json()["status"] == "pending"
    assert not Class.objects.exists()
    pk = answer.json()["id"]
    assert api(instructor).post(f"/api/v1/approvals/{pk}/approve/", {}, format="json").status_code == 403
    done = api(approver).post(f"/api/v1/approvals/{pk}/approve/", {}, format="json")
    assert done.status_code == 200 and Class.objects.get(pk=done.json()["made_id"]).name == "Lab"


def test_the_course_page_sends_the_instructor_to_the_waiting_request(client, sim_host, image, course, instructor, term):
    client.force_login(instructor)
    days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    form = {
        "name": "Lab",
        "image": image.pk,
        "time_zone": "UTC",
        "first_day": term["first_day"].isoformat(),
        "last_day": term["last_day"].isoformat(),
        "sessions": f"{days[term['first_day'].weekday()]} 10:00 60",
        "lead_minutes": 15,
        "gpus": 0,
        "requires_approval": "on",
    }
    answer = client.post(reverse("classes:course", args=[course.pk]), form)
    request = ApprovalRequest.objects.get()
    assert answer.status_code == 302 and answer["Location"] == reverse("reservations:approval", args=[request.pk])
    assert "Waiting for approval" in client.get(answer["Location"]).content.decode()
    assert not Class.objects.exists()


def test_a_change_that_claims_what_no_approver_saw_is_refused(sim_host, image, course, instructor, term, admin_user):
    """Approved (or made by the system), a class that requires approval keeps what was approved:
    an instructor's change of its seats, term, image or flag is refused, claiming nothing."""
    klass = services.create_class(
        actor="test", course=course, name="Lab", image=image, requires_approval=True, seats=1, **term
    )
    claims = Allocation.objects.count()
    longer = term["last_day"] + timedelta(days=7)
    for change in ({"seats": 5}, {"last_day": longer}, {"vcpus": 8}, {"requires_approval": False}):
        with pytest.raises(ValidationError, match="needs an approver's approval"):
            services.change_class(klass, actor=instructor, by=instructor, **change)
    klass.refresh_from_db()
    assert (klass.seats, klass.last_day, klass.requires_approval) == (1, term["last_day"], True)
    assert Allocation.objects.count() == claims
    assert services.change_class(klass, actor=instructor, by=instructor, name="Lab 2").name == "Lab 2"
    assert services.change_class(klass, actor=admin_user, by=admin_user, seats=2).seats == 2


def test_a_change_to_an_image_that_requires_approval_is_refused(sim_host, image, course, instructor, term):
    klass = services.create_class(actor="test", course=course, name="Lab", image=image, **term)
    gated = sim_image("gated", requires_approval=True, min_memory_mib=256)
    with pytest.raises(ValidationError, match="needs an approver's approval"):
        services.change_class(klass, actor=instructor, by=instructor, image=gated)
    klass.refresh_from_db()
    assert klass.image == image and not klass.meetings.filter(block__image=gated).exists()
    assert services.change_class(klass, actor=instructor, by=instructor, seats=3).seats == 3  # no approval: at once
