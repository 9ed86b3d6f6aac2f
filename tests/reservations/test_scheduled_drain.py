"""A host drained (or taken offline) "after its current reservations" (VCL): from the moment it
is scheduled it takes nothing that outlasts them, and it goes drained by itself once the last
has ended (the reservations clock); shown on the host page and the API, cancelable, staff only."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from capacity.snapshot import snapshot
from core.models import ObjectChange
from inventory import services as inventory
from inventory.models import Hypervisor
from reservations import services
from reservations.models import Reservation

H = timedelta(hours=1)


def host_of(reservation):
    return Reservation.objects.get(pk=reservation.pk).allocation.host.name


def test_it_takes_only_what_ends_by_then_and_drains_when_the_last_ends(make_host, image, alice, admin_user, sync_jobs):
    leaving = make_host("sim-a", cpus=8, memory_mib=8192, disk_gib=200)
    current = services.reserve(alice, image, actor=alice, duration=2 * H)
    sync_jobs.drain()
    inventory.schedule_state(leaving, "drained", "new disks", actor=admin_user)
    leaving.refresh_from_db()
    assert leaving.state == "online" and leaving.scheduled_state == "drained"
    assert leaving.scheduled_until == Reservation.objects.get(pk=current.pk).end
    short = services.reserve(alice, image, actor=alice, duration=H)  # ends before: placed there
    assert host_of(short) == "sim-a"
    with pytest.raises(ValidationError, match="leaving service before the end"):
        services.reserve(alice, image, actor=alice, duration=3 * H)
    with pytest.raises(ValidationError, match="leaving service before the end"):
        services.extend(Reservation.objects.get(pk=short.pk), current.end + H, actor=alice)
    make_host("sim-b", cpus=8, memory_mib=8192, disk_gib=200)
    snapshot.expire()
    assert host_of(services.reserve(alice, image, actor=alice, duration=3 * H)) == "sim-b"
    sync_jobs.drain()

    assert "hosts_left_service" not in services.tick(actor=admin_user)  # its reservations still run
    for reservation in Reservation.objects.filter(allocation__host=leaving, status__in=Reservation.ACTIVE):
        services.end(reservation, "done early", actor=alice)
    sync_jobs.drain()
    assert services.tick(actor=admin_user)["hosts_left_service"] == ["sim-a"]
    leaving.refresh_from_db()
    assert leaving.state == "drained" and leaving.state_reason.startswith("new disks (scheduled by admin")
    assert (leaving.scheduled_state, leaving.scheduled_until) == ("", None)
    assert "hosts_left_service" not in services.tick(actor=admin_user)  # done once
    assert ObjectChange.objects.filter(object_id=str(leaving.pk), action="state").count() == 1


def test_an_empty_host_goes_at_the_next_tick_and_a_canceled_one_not_at_all(make_host, admin_user, db):
    empty, kept = make_host("sim-a"), make_host("sim-b")
    inventory.schedule_state(empty, "offline", "decommission", actor=admin_user)
    inventory.schedule_state(kept, "drained", "maybe", actor=admin_user)
    assert inventory.cancel_schedule(kept, actor=admin_user) is True
    assert inventory.cancel_schedule(kept, actor=admin_user) is False
    assert services.tick(actor=admin_user)["hosts_left_service"] == ["sim-a"]
    assert Hypervisor.objects.get(pk=empty.pk).state == "offline"
    assert Hypervisor.objects.get(pk=kept.pk).state == "online"


def test_bad_schedules_are_refused_with_the_field(make_host, admin_user, db):
    host = make_host("sim-a")
    for state, reason, field in (("online", "x", "state"), ("drained", " ", "reason")):
        with pytest.raises(ValidationError) as exc:
            inventory.schedule_state(host, state, reason, actor=admin_user)
        assert field in exc.value.message_dict
    inventory.set_state(host, "offline", "broken", actor=admin_user)
    with pytest.raises(ValidationError, match="offline already"):
        inventory.schedule_state(host, "drained", "x", actor=admin_user)


def test_the_api_and_the_page_show_and_cancel_it_for_staff_only(make_host, admin_user, alice, api, client, db):
    host = make_host("sim-a")
    url = f"/api/v1/hypervisors/{host.pk}/schedule/"
    assert api(alice).post(url, {"state": "drained", "reason": "x"}, format="json").status_code == 403
    assert api(alice).delete(url).status_code == 403
    client.force_login(alice)
    assert (
        client.post(f"/inventory/hypervisors/{host.pk}/schedule/", {"state": "drained", "reason": "x"}).status_code
        == 403
    )
    assert client.post(f"/inventory/hypervisors/{host.pk}/schedule/cancel/").status_code == 403
    assert Hypervisor.objects.get(pk=host.pk).scheduled_state == ""
    assert api(admin_user).post(url, {"state": "drained", "reason": "x", "when": 1}, format="json").status_code == 400
    body = api(admin_user).post(url, {"state": "drained", "reason": "new disks"}, format="json").json()
    assert body["scheduled_state"] == "drained" and body["scheduled_until"] and body["state"] == "online"
    assert api(admin_user).get(f"/api/v1/hypervisors/{host.pk}/").json()["scheduled_reason"] == "new disks"
    client.force_login(admin_user)
    page = client.get(f"/inventory/hypervisors/{host.pk}/").content.decode()
    assert "Goes <strong>drained</strong> when its current reservations end" in page
    assert api(admin_user).delete(url).json()["scheduled_state"] == ""
    response = client.post(
        f"/inventory/hypervisors/{host.pk}/schedule/", {"state": "offline", "reason": "old"}, follow=True
    )
    assert "goes offline when its reservations end" in response.content.decode()
    client.post(f"/inventory/hypervisors/{host.pk}/schedule/cancel/")
    assert Hypervisor.objects.get(pk=host.pk).scheduled_state == ""
