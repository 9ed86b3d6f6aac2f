"""Approvals, in-process on a simulated host with mail through a real SMTP server (one per module):
a reservation of an image that requires approval waits, holding nothing; its approvers are
mailed; approved, it is reserved and built as any other and its requester is told; denied or
expired, its requester is told why and nothing was ever claimed. Who may decide: approvers of
the requester's groups and administrators, never the requester."""

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse
from django.utils import timezone

from accounts import access, preferences
from capacity.models import Allocation
from core.errors import Conflict
from notifications.models import Notification
from provisioning import services as vms
from reservations import approvals, schedule, services
from reservations.models import ApprovalRequest, Reservation
from tests.mailserver import delivered

pytestmark = pytest.mark.django_db
H = timedelta(hours=1)


@pytest.fixture
def gated(image, lab):
    """The image (restricted to ``lab``) requires approval."""
    return vms.update_image(image, actor="test", requires_approval=True)


@pytest.fixture
def requester(alice, lab):
    alice.groups.add(lab)
    return alice


@pytest.fixture
def approver(make_approver, lab):
    """carol: an approver in ``lab``."""
    return make_approver(lab)


def ask(user, image, **when):
    return services.ask_reservation(user, image, actor=user, **({"duration": 2 * H} | when))


def test_a_request_waits_then_is_reserved_and_built_when_approved(
    sim_host, gated, requester, approver, sync_jobs, mail
):
    request = ask(requester, gated)
    assert isinstance(request, ApprovalRequest) and request.status == "pending"
    assert not Reservation.objects.exists() and not Allocation.objects.exists()  # nothing held while waiting
    assert abs(request.expires_at - (request.created + 48 * H)) < timedelta(seconds=5)
    mails = delivered(mail, 1)
    [(subject, body)] = mails["carol@example.org"]
    assert subject == "Approval wanted: a reservation of debian-12, as soon as approved, for 2 h 00 min for alice"
    assert f"request #{request.pk}" in body

    request = services.approve(request, actor=approver, reason="course work")
    assert request.status == "approved" and request.decided_by == approver
    reservation = Reservation.objects.get(pk=request.made_id)
    assert reservation.user == requester and reservation.allocation is not None
    assert reservation.end - reservation.start == 2 * H
    sync_jobs.drain()
    assert Reservation.objects.get(pk=reservation.pk).status == "ready"
    mails = delivered(mail, 3)
    subjects = [s for s, _ in mails["alice@example.org"]]
    assert f"Your request #{request.pk} was approved" in subjects
    assert f"Your reservation #{reservation.pk} (debian-12) is ready" in subjects
    told = dict(mails["alice@example.org"])[f"Your request #{request.pk} was approved"]
    assert f"reservation #{reservation.pk} holds its place now" in told and "Reason: course work" in told


def test_a_denied_request_tells_the_reason_and_holds_nothing(sim_host, gated, requester, approver, mail):
    request = ask(requester, gated, start=timezone.now() + 3 * H)
    assert request.expires_at == request.starts_at  # its start comes before 48 hours pass
    with pytest.raises(ValidationError):
        services.deny(request, actor=approver, reason="  ")  # a denial says why
    request = services.deny(request, actor=approver, reason="not this week")
    assert request.status == "denied" and request.reason == "not this week"
    assert not Reservation.objects.exists() and not Allocation.objects.exists()
    mails = delivered(mail, 2)  # carol's "approval wanted", alice's answer
    [(subject, body)] = mails["alice@example.org"]
    assert subject == f"Your request #{request.pk} was denied"
    assert "Reason: not this week" in body and "Nothing was held for it" in body
    with pytest.raises(Conflict):
        services.approve(request, actor=approver)  # decided once


def test_an_unanswered_request_expires_and_tells_the_requester(sim_host, gated, requester, approver, mail):
    request = ask(requester, gated)
    assert schedule.tick(now=timezone.now() + 47 * H).get("approvals_expired") is None
    assert schedule.tick(now=request.expires_at + timedelta(minutes=1))["approvals_expired"] == 1
    request.refresh_from_db()
    assert request.status == "expired" and request.decided_by is None
    assert not Reservation.objects.exists() and not Allocation.objects.exists()
    mails = delivered(mail, 2)
    [(subject, body)] = mails["alice@example.org"]
    assert subject == f"Your request #{request.pk} expired" and "nobody decided it in time" in body


def test_an_approval_past_the_expiry_expires_instead(sim_host, gated, requester, approver):
    request = ask(requester, gated)
    with pytest.raises(Conflict, match="expired"):
        services.approve(request, actor=approver, now=request.expires_at + timedelta(seconds=1))
    assert ApprovalRequest.objects.get(pk=request.pk).status == "expired" and not Reservation.objects.exists()


def test_an_approval_with_no_room_left_fails_and_says_why(
    sim_host, gated, requester, approver, bob, image, mail, settings
):
    settings.RESERVATION_MAX_PER_USER = 20
    request = ask(requester, gated, start=timezone.now() + 2 * H)
    vms.update_image(image, actor="test", requires_approval=False, visibility="public")
    while True:  # meanwhile others take the host
        try:
            services.reserve(bob, image, actor=bob, start=request.starts_at, duration=2 * H)
        except ValidationError as exc:
            assert "no host has room then" in str(exc)
            break
    held = Allocation.objects.filter(released__isnull=True).count()
    request = services.approve(request, actor=approver)
    assert request.status == "failed" and "no host has room then" in request.reason
    assert not Reservation.objects.filter(user=requester).exists()
    assert Allocation.objects.filter(released__isnull=True).count() == held  # nothing more claimed
    mails = delivered(mail, 2)
    [(subject, body)] = mails["alice@example.org"]
    assert subject == f"Your request #{request.pk} was approved but could not be made"
    assert "no host has room then" in body


def test_nobody_decides_their_own_request(sim_host, gated, requester, approver, lab):
    access.set_roles(requester, ["approver"], actor="test")  # an approver too
    request = ask(requester, gated)
    with pytest.raises(PermissionDenied, match="your own"):
        services.approve(request, actor=requester)
    assert approvals.decidable(requester).count() == 0 and approvals.decidable(approver).count() == 1
    assert services.approve(request, actor=approver).status == "approved"


def test_approvers_decide_only_for_their_groups_and_administrators_for_all(
    sim_host, gated, requester, approver, admin_user, django_user_model, settings
):
    other = django_user_model.objects.create_user("dave", "dave@example.org", "dave-pass-1")
    access.set_roles(other, ["approver"], actor="test")  # an approver of no group of alice's
    request = ask(requester, gated)
    told = set(Notification.objects.filter(kind="approval_request").values_list("user__username", flat=True))
    assert told == {"carol", "admin"}
    assert not approvals.may_decide(other, request) and approvals.may_decide(admin_user, request)
    with pytest.raises(PermissionDenied):
        services.deny(request, actor=other, reason="no")
    settings.APPROVERS_BY_GROUP = False  # approvers decide anyone's
    assert approvals.may_decide(other, request)


def test_an_administrators_own_reservation_does_not_wait(sim_host, gated, admin_user):
    reservation = ask(admin_user, gated)
    assert isinstance(reservation, Reservation) and not ApprovalRequest.objects.exists()


def test_a_request_that_could_never_be_is_refused_before_anyone_is_asked(gated, requester, approver):
    with pytest.raises(ValidationError) as refused:
        ask(requester, gated, start=timezone.now() - 2 * H)
    assert "start" in refused.value.message_dict and not ApprovalRequest.objects.exists()
    assert not Notification.objects.exists()


def test_the_requester_withdraws_a_waiting_request_and_nobody_else_does(gated, requester, approver):
    request = ask(requester, gated)
    with pytest.raises(PermissionDenied):
        services.withdraw(request, actor=approver)
    assert services.withdraw(request, actor=requester).status == "withdrawn"
    with pytest.raises(Conflict):
        services.approve(request, actor=approver)
    assert not Notification.objects.filter(kind="approval_decided").exists()  # one's own act: no mail


def test_a_submitted_twice_form_asks_once(gated, requester, approver):
    first = ask(requester, gated, request_key="k-1")
    assert ask(requester, gated, request_key="k-1") == first and ApprovalRequest.objects.count() == 1


# --- the API -----------------------------------------------------------------------------------


def test_the_api_asks_lists_and_decides(sim_host, gated, requester, approver, bob, api):
    answer = api(requester).post("/api/v1/reservations/", {"image": gated.pk, "duration_minutes": 60}, format="json")
    assert answer.status_code == 202, answer.content
    assert answer.json()["reservation"] is None and answer.json()["approval"]["status"] == "pending"
    pk = answer.json()["approval"]["id"]

    mine = api(requester).get("/api/v1/approvals/").json()["results"]
    assert [(r["id"], r["may_decide"]) for r in mine] == [(pk, False)]
    queue = api(approver).get("/api/v1/approvals/").json()["results"]
    assert [(r["id"], r["requester"], r["may_decide"]) for r in queue] == [(pk, "alice", True)]
    assert api(bob).get("/api/v1/approvals/").json()["results"] == []
    told = api(approver).get("/api/v1/notifications/", {"kind": "approval_request"}).json()["results"]
    assert [(n["user"], n["event_kind"]) for n in told] == [(approver.pk, "approval.requested")]  # the in-app list

    assert api(requester).post(f"/api/v1/approvals/{pk}/approve/", {}, format="json").status_code == 403
    assert api(bob).post(f"/api/v1/approvals/{pk}/approve/", {}, format="json").status_code == 403
    refused = api(approver).post(f"/api/v1/approvals/{pk}/deny/", {}, format="json")
    assert refused.status_code == 400 and "reason" in refused.json()["error"]["fields"]
    done = api(approver).post(f"/api/v1/approvals/{pk}/approve/", {"reason": "ok"}, format="json")
    assert done.status_code == 200 and done.json()["status"] == "approved"
    assert Reservation.objects.get(pk=done.json()["made_id"]).user == requester
    again = api(approver).post(f"/api/v1/approvals/{pk}/deny/", {"reason": "late"}, format="json")
    assert again.status_code == 409
    second = services.ask_reservation(requester, gated, actor=requester, duration=H)
    assert api(approver).post(f"/api/v1/approvals/{second.pk}/withdraw/").status_code == 403
    assert api(requester).post(f"/api/v1/approvals/{second.pk}/withdraw/").json()["status"] == "withdrawn"


# --- the pages ---------------------------------------------------------------------------------


def test_the_pages_show_waiting_and_let_an_approver_decide(client, sim_host, gated, requester, approver):
    client.force_login(requester)
    answer = client.post(
        reverse("reservations:reserve"),
        {"image": gated.pk, "when": "now", "duration": "60", "request_key": "7c0e0f3e-1111-4c4c-8a8a-000000000001"},
    )
    request = ApprovalRequest.objects.get()
    assert answer.status_code == 302 and answer["Location"] == reverse("reservations:approval", args=[request.pk])
    page = client.get(answer["Location"]).content.decode()
    assert "Waiting for approval" in page and "nothing is reserved until an approver approves it" in page
    assert "Approve</button>" not in page
    home = client.get(reverse("home")).content.decode()
    assert f'id="home-approval-{request.pk}"' in home and "waiting for approval" in home
    listed = client.get(reverse("reservations:list")).content.decode()
    assert f'id="home-approval-{request.pk}"' in listed and "waiting for approval" in listed
    decide = reverse("reservations:approval-decide", args=[request.pk])
    assert client.post(decide, {"decision": "approve"}).status_code == 403  # not one's own

    client.force_login(approver)
    queue = client.get(reverse("reservations:approvals")).content.decode()
    assert f'id="approval-{request.pk}"' in queue
    client.post(decide, {"decision": "deny", "reason": ""})
    assert ApprovalRequest.objects.get().status == "pending"  # a denial needs a reason
    client.post(decide, {"decision": "approve", "reason": ""})
    assert ApprovalRequest.objects.get().status == "approved" and Reservation.objects.filter(user=requester).exists()


def test_a_block_of_an_image_that_requires_approval_is_an_administrators(
    sim_host, gated, lab, django_user_model, admin_user
):
    """A block claims its seats at once: an instructor's would go around the approval."""
    teacher = django_user_model.objects.create_user("tess")
    lab.user_set.add(teacher)
    access.set_roles(teacher, ["instructor"], actor="test")
    start = timezone.now() + 24 * H
    block = {"name": "lab", "image": gated, "group": lab, "seats": 1, "start": start, "end": start + H}
    with pytest.raises(ValidationError, match="needs an approver's approval"):
        services.create_block(actor=teacher, created_by=teacher, **block)
    assert not Reservation.objects.exists() and not Allocation.objects.exists()
    assert services.create_block(actor=admin_user, created_by=admin_user, **block).seats == 1


def test_times_are_said_in_each_readers_zone_in_mails_and_on_pages(client, gated, requester, approver, mail):
    """The form's start is in the requester's zone; the approver in another zone is mailed the
    same instants in theirs, the requester's answer and pages say them in the requester's."""
    berlin, kolkata = ZoneInfo("Europe/Berlin"), ZoneInfo("Asia/Kolkata")
    preferences.set_time_zone(requester, "Europe/Berlin", actor=requester)
    preferences.set_time_zone(approver, "Asia/Kolkata", actor=approver)
    start = (timezone.now() + 24 * H).astimezone(berlin).replace(second=0, microsecond=0)
    request = ask(requester, gated, start=start)
    assert request.summary == "a reservation of debian-12 for 2 h 00 min"  # no clock time: each reader's own

    def said(moment, zone):
        moment = moment.astimezone(zone)
        return f"{moment:%Y-%m-%d %H:%M} {moment:%Z}"

    [(subject, body)] = delivered(mail, 1)["carol@example.org"]
    window = f"from {said(start, kolkata)} to {said(start + 2 * H, kolkata)}"
    assert window in subject and f"alice asks for a reservation of debian-12 for 2 h 00 min, {window}." in body
    assert f"it expires at {said(request.expires_at, kolkata)}." in body and "UTC" not in subject + body

    services.deny(request, actor=approver, reason="not this week")
    [(subject, body)] = delivered(mail, 2)["alice@example.org"]  # carol's, then alice's
    assert f"from {said(start, berlin)} to {said(start + 2 * H, berlin)} was denied" in body, body

    client.force_login(requester)
    page = client.get(reverse("reservations:approval", args=[request.pk])).content.decode()
    assert f"{said(start, berlin)} to {said(start + 2 * H, berlin)}" in page and "UTC" not in page
    listing = client.get(reverse("reservations:approvals")).content.decode()
    assert f"from {said(start, berlin)}" in listing and "When (UTC)" not in listing
