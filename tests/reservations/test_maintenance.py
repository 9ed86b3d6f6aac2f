"""Maintenance keeps reservations: a migrated VM's claim is the one its reservation extends,
and draining or offlining a host moves its future reservations' claims to other hosts (or
flags them, telling the user and the admins), never building one there."""

from datetime import timedelta

from django.utils import timezone

from capacity.models import Allocation
from capacity.snapshot import snapshot
from core import topics
from core.models import Event
from inventory import services as inventory
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import VM
from reservations import services
from reservations.models import Reservation

H = timedelta(hours=1)
URL = "/api/v1/reservations/"


def live_hosts():
    return sorted(Allocation.objects.filter(released__isnull=True).values_list("host__name", flat=True))


def test_a_migrated_reservation_extends_the_claim_that_moved(make_host, image, alice, api, sync_jobs):
    source = make_host("sim-a", cpus=8, memory_mib=8192, disk_gib=200)
    reservation = services.reserve(alice, image, actor=alice, duration=H)
    sync_jobs.drain()
    vm = VM.objects.get(pk=Reservation.objects.get(pk=reservation.pk).vm_id)
    assert vm.state == "running" and vm.host == source
    target = make_host("sim-b", cpus=8, memory_mib=8192, disk_gib=200)
    snapshot.expire()
    job = vms.submit_action(vm, "migrate", actor="test", target=target.pk)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success"
    source_claim = Allocation.objects.get(host=source)
    new_end = reservation.end + H
    response = api(alice).post(f"{URL}{reservation.pk}/extend/", {"end": new_end.isoformat()}, format="json")
    assert response.status_code == 200, response.content[:300]
    reservation = Reservation.objects.select_related("allocation", "vm").get(pk=reservation.pk)
    assert reservation.end == new_end and reservation.allocation.host == target
    assert reservation.allocation.end == new_end and reservation.allocation.released is None
    assert reservation.vm.allocation_id == reservation.allocation_id
    assert source_claim.released is not None and live_hosts() == ["sim-b"]


def test_draining_a_host_moves_its_three_future_reservations(make_host, image, alice, admin_user, sync_jobs):
    doomed = make_host("sim-a", cpus=8, memory_mib=8192, disk_gib=200)
    start = timezone.now() + 5 * H
    reservations = [services.reserve(alice, image, actor=alice, start=start, end=start + H) for _ in range(3)]
    assert live_hosts() == ["sim-a"] * 3
    make_host("sim-b", cpus=8, memory_mib=8192, disk_gib=200)
    snapshot.expire()
    inventory.set_state(doomed, "drained", "new disks", actor=admin_user)
    sync_jobs.drain()
    job = Job.objects.get(opcode="node.replace_reservations")
    assert job.status == "success", job.error_message
    assert live_hosts() == ["sim-b"] * 3 and not Allocation.objects.filter(host=doomed, released__isnull=True)
    for reservation in Reservation.objects.filter(pk__in=[r.pk for r in reservations]):
        assert reservation.allocation.host.name == "sim-b" and not reservation.degraded
        assert "moved from sim-a to sim-b" in reservation.history.last().reason
        services.provision(reservation.pk, actor="test")
    sync_jobs.drain()
    built = VM.objects.filter(reservations__in=reservations)
    assert built.count() == 3 and {vm.host.name for vm in built} == {"sim-b"}


def test_a_reservation_with_no_room_elsewhere_is_flagged_and_both_told(
    make_host, image, alice, admin_user, client, sync_jobs
):
    doomed = make_host("sim-a", cpus=8, memory_mib=8192, disk_gib=200)
    start = timezone.now() + 5 * H
    reservation = services.reserve(alice, image, actor=alice, start=start, end=start + H)
    make_host("sim-tiny", cpus=1, memory_mib=512, disk_gib=5)
    snapshot.expire()
    inventory.set_state(doomed, "offline", "power supply died", actor=admin_user)
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert "sim-a is offline (power supply died)" in reservation.degraded
    assert reservation.allocation.host == doomed and reservation.allocation.released is None
    assert reservation.history.last().reason.startswith("endangered: sim-a is offline")
    for topic in (topics.user_topic(alice), "admin"):
        event = Event.objects.get(kind="reservation.degraded", topic=topic)
        assert event.data["id"] == reservation.pk and "power supply died" in event.data["reason"]
    body = services_api_detail(alice, reservation)
    assert "sim-a is offline" in body["degraded"]
    client.force_login(alice)
    page = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert "Endangered" in page and "power supply died" in page
    inventory.set_state(doomed, "online", "power supply replaced", actor=admin_user)
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert not reservation.degraded and reservation.history.last().reason == "safe again: sim-a is back online"


def services_api_detail(user, reservation):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client.get(f"{URL}{reservation.pk}/").json()


def test_a_build_on_a_host_that_went_offline_is_re_placed(make_host, image, alice, sync_jobs):
    from inventory.models import Hypervisor

    gone = make_host("sim-a", cpus=8, memory_mib=8192, disk_gib=200)
    start = timezone.now() + 5 * H
    reservation = services.reserve(alice, image, actor=alice, start=start, end=start + H)
    make_host("sim-b", cpus=8, memory_mib=8192, disk_gib=200)
    # Offline behind vclmgr's back (no state-change job moved the claim): the build must not adopt it.
    Hypervisor.objects.filter(pk=gone.pk).update(state="offline")
    snapshot.expire()
    services.provision(reservation.pk, actor="test")
    sync_jobs.drain()
    reservation = Reservation.objects.select_related("vm__host", "allocation__host").get(pk=reservation.pk)
    assert reservation.status == "ready", reservation.error
    assert reservation.vm.host.name == "sim-b" and reservation.allocation.host.name == "sim-b"
    assert reservation.vm.allocation_id == reservation.allocation_id and live_hosts() == ["sim-b"]


def test_re_placing_again_changes_nothing_and_an_online_host_keeps_its_claims(make_host, image, alice, admin_user):
    host = make_host("sim-a", cpus=8, memory_mib=8192, disk_gib=200)
    start = timezone.now() + 5 * H
    reservation = services.reserve(alice, image, actor=alice, start=start, end=start + H)
    make_host("sim-b", cpus=8, memory_mib=8192, disk_gib=200)
    snapshot.expire()
    assert services.replace_off_host(reservation.pk, host.pk, actor="test")["note"]  # online: stays
    inventory.set_state(host, "drained", "new disks", actor=admin_user)  # the job is queued, run by hand here
    assert services.replace_off_host(reservation.pk, host.pk, actor="test")["moved"]
    assert services.replace_off_host(reservation.pk, host.pk, actor="test")["note"]  # a retried step
    assert live_hosts() == ["sim-b"] and Allocation.objects.count() == 2
    inventory.set_state(host, "online", "disks in", actor=admin_user)
    assert Job.objects.filter(opcode="node.replace_reservations").count() == 1
