"""An environment with a machine of an image that requires approval, on the simulator with mail
through a real SMTP server (one per module): one request for the whole environment naming the
images, nothing held while it waits; approved, every machine is placed and built as one;
denied, or no longer fitting, nothing is claimed."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from capacity.models import Allocation
from provisioning import services as vms
from provisioning.models import QuotaRule
from reservations import services
from reservations.models import ApprovalRequest, Reservation
from tests import images
from tests.environments.conftest import debian, make_template, router_image, trio  # noqa: F401 (fixtures)
from tests.mailserver import delivered

H = timedelta(hours=1)


@pytest.fixture
def course(alice):
    group = Group.objects.create(name="netcourse")
    alice.groups.add(group)
    return group


@pytest.fixture
def approver(make_approver, course):
    """carol: an approver of alice's group."""
    return make_approver(course)


@pytest.fixture
def gated_net(trio, router_image):  # noqa: F811 (fixtures)
    """``trio``, whose router's image requires approval (its clients' does not)."""
    vms.update_image(router_image, actor="test", requires_approval=True)
    return trio


def machines(head_id):
    return Reservation.objects.filter(pk=head_id) | Reservation.objects.filter(head_id=head_id)


def test_it_waits_for_one_approval_then_is_built_as_one(make_host, gated_net, alice, approver, sync_jobs, mail):
    make_host("big", cpus=16, memory_mib=16384)
    request = services.ask_environment(alice, gated_net, actor=alice, duration=2 * H)
    assert isinstance(request, ApprovalRequest) and request.status == "pending" and request.kind == "environment"
    assert request.image.name == "vyos" and request.payload["images"] == ["vyos"]
    assert not Reservation.objects.exists() and not Allocation.objects.exists()  # nothing held while waiting
    mails = delivered(mail, 1)
    [(subject, body)] = mails["carol@example.org"]
    assert subject == (
        "Approval wanted: a reservation of environment trio, as soon as approved, for 2 h 00 min "
        "(approval needed for vyos) for alice"
    )
    assert "Its machines' images vyos require approval" in body and f"request #{request.pk}" in body

    request = services.approve(request, actor=approver, reason="lab week")
    assert request.status == "approved"
    head = Reservation.objects.get(pk=request.made_id)
    assert head.head_id is None and head.hostname == "router" and head.user == alice
    assert {m.hostname for m in machines(head.pk)} == {"router", "client", "server"}
    assert len({m.allocation.host_id for m in machines(head.pk)}) == 1  # placed as one
    sync_jobs.drain()
    assert {m.status for m in machines(head.pk)} == {"ready"}
    mails = delivered(mail, 3)
    subjects = dict(mails["alice@example.org"])
    told = subjects[f"Your request #{request.pk} was approved"]
    assert f"environment reservation #{head.pk} holds every machine's place now" in told
    assert "Reason: lab week" in told


def test_a_denied_environment_claims_nothing(make_host, gated_net, alice, approver, mail):
    make_host("big", cpus=16, memory_mib=16384)
    request = services.ask_environment(alice, gated_net, actor=alice, start=timezone.now() + 3 * H, duration=H)
    assert request.expires_at == request.starts_at and request.ends_at == request.starts_at + H
    request = services.deny(request, actor=approver, reason="not this term")
    assert request.status == "denied"
    assert not Reservation.objects.exists() and not Allocation.objects.exists()
    mails = delivered(mail, 2)
    [(subject, body)] = mails["alice@example.org"]
    assert subject == f"Your request #{request.pk} was denied" and "Nothing was held for it" in body


def test_an_approval_that_no_longer_fits_fails_and_claims_nothing(make_host, gated_net, alice, approver):
    host = make_host("big", cpus=16, memory_mib=16384)
    request = services.ask_environment(alice, gated_net, actor=alice, duration=H)
    from inventory import services as inventory

    inventory.set_state(host, "drained", "firmware", actor="test")  # meanwhile the only host is taken away
    request = services.approve(request, actor=approver)
    assert request.status == "failed" and "approved, but it cannot be made now" in request.reason
    assert not Reservation.objects.exists() and not Allocation.objects.filter(released__isnull=True).exists()


def test_an_approval_of_a_template_that_gained_a_gated_image_since_fails(make_host, gated_net, alice, approver):
    from environments import services as templates
    from tests.environments.conftest import member

    make_host("big", cpus=16, memory_mib=16384)
    request = services.ask_environment(alice, gated_net, actor=alice, duration=H)
    licensed = images.sim_image("oracle-db", os="Oracle Linux")
    vms.update_image(licensed, actor="test", requires_approval=True)
    grown = [*templates.as_specs(gated_net)[0], member("db", licensed, "inside")]
    templates.update_template(gated_net, actor=alice, members=grown)
    request = services.approve(request, actor=approver)
    assert request.status == "failed" and request.reason == (
        "approved, but it cannot be made now: environment trio has machines of oracle-db since it was asked "
        "for, which the approval did not cover: ask again"
    )
    assert not Reservation.objects.exists() and not Allocation.objects.filter(released__isnull=True).exists()


def test_it_is_checked_as_a_reservation_before_anyone_is_asked(gated_net, alice, approver, course):
    QuotaRule.objects.create(name="course memory", group=course, max_memory_mib=1024)
    with pytest.raises(ValidationError, match="group netcourse already holds 0 MiB of memory"):
        services.ask_environment(alice, gated_net, actor=alice, duration=H)
    with pytest.raises(ValidationError, match="the end must be after the start"):
        services.ask_environment(alice, gated_net, actor=alice, start=timezone.now() + H, end=timezone.now())
    assert not ApprovalRequest.objects.exists()


def test_reserving_it_without_the_approval_is_refused(gated_net, alice):
    with pytest.raises(ValidationError, match="router: image vyos requires approval: ask for the environment"):
        services.reserve_environment(alice, gated_net, actor=alice, duration=H)


def test_an_administrators_own_environment_does_not_wait(make_host, gated_net, admin_user):
    make_host("big", cpus=16, memory_mib=16384)
    vms.update_image(gated_net.members.get(entry=True).image, actor="test", visibility="public")
    gated_net.visibility = "public"
    gated_net.save(update_fields=["visibility"])
    head = services.ask_environment(admin_user, gated_net, actor=admin_user, duration=H)
    assert isinstance(head, Reservation) and machines(head.pk).count() == 3


def test_the_api_and_the_page_ask_for_it(make_host, gated_net, alice, approver, api, client):
    make_host("big", cpus=16, memory_mib=16384)
    answer = api(alice).post("/api/v1/reservations/", {"environment": gated_net.pk, "duration_minutes": 60})
    assert answer.status_code == 202, answer.content
    assert answer.json()["reservation"] is None and answer.json()["approval"]["kind"] == "environment"
    assert not Reservation.objects.exists()

    client.force_login(alice)
    url = reverse("reservations:reserve-environment", args=[gated_net.pk])
    key = client.get(url).context["form"].initial["request_key"]
    made = client.post(url, {"when": "now", "duration": 60, "ssh_key": "", "request_key": key})
    second = ApprovalRequest.objects.exclude(pk=answer.json()["approval"]["id"]).get()
    assert made.status_code == 302 and made["Location"] == reverse("reservations:approval", args=[second.pk])
    assert (
        client.post(url, {"when": "now", "duration": 60, "ssh_key": "", "request_key": key})["Location"]
        == (made["Location"])
    )  # asked once

    client.force_login(approver)
    client.post(reverse("reservations:approval-decide", args=[second.pk]), {"decision": "approve", "reason": ""})
    second.refresh_from_db()
    page = client.get(reverse("reservations:approval", args=[second.pk])).content.decode()
    assert f'href="/reservations/{second.made_id}/"' in page
