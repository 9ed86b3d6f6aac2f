"""A host that stops answering (sim's injected fault) is drained, then marked offline after
``HOST_OFFLINE_AFTER_CHECKS`` failed refreshes; the reservations whose VMs ran on it are
rebuilt elsewhere from their images and become ready (or fail, per image, or when no other
host has room), their users told; the lost VM is cleaned by verify/repair when the host returns."""

from datetime import timedelta

import pytest

from capacity.models import Allocation
from capacity.snapshot import snapshot
from core.models import Event
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from inventory.models import Hypervisor
from jobs.models import Job
from provisioning import repair, tasks
from provisioning.models import VM
from provisioning.opcodes import host_ops
from reservations import services
from reservations.models import Reservation
from tests.provisioning.test_verify import run_verify

H = timedelta(hours=1)


@pytest.fixture(autouse=True)
def _two_checks(settings):
    settings.HOST_OFFLINE_AFTER_CHECKS = 2


def ready_on(make_host, image, alice, sync_jobs, name="sim-a"):
    host = make_host(name, cpus=8, memory_mib=8192, disk_gib=200)
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H)
    sync_jobs.drain()
    reservation.refresh_from_db()
    assert reservation.status == "ready" and reservation.vm.host == host
    return host, reservation


def refresh(sync_jobs, times=1):
    for _ in range(times):
        tasks.refresh_all()
        sync_jobs.drain()


def kill(host):
    sim.ensure_host(host.name)
    sim.set_fault(host.name, "*", "unreachable")


def test_a_dead_hosts_reservation_is_rebuilt_elsewhere_and_ready(make_host, image, alice, admin_user, sync_jobs):
    dead, reservation = ready_on(make_host, image, alice, sync_jobs)
    old_vm = reservation.vm
    spare = make_host("sim-b", cpus=8, memory_mib=8192, disk_gib=200)
    snapshot.expire()
    kill(dead)
    refresh(sync_jobs)
    dead.refresh_from_db()
    assert dead.state == "drained" and dead.state_reason.startswith(host_ops.AUTO_DRAIN)
    assert not Job.objects.filter(opcode="node.reprovision").exists()  # one silence is not death
    refresh(sync_jobs)
    dead.refresh_from_db()
    assert dead.state == "offline" and dead.state_reason.startswith(host_ops.AUTO_OFFLINE)
    assert "2 failed checks" in dead.state_reason
    job = Job.objects.get(opcode="node.reprovision")
    assert job.status == "success" and job.result["rebuilt"] == [reservation.pk], job.error_message
    reservation = Reservation.objects.select_related("vm", "allocation").get(pk=reservation.pk)
    assert reservation.status == "ready" and reservation.vm.host == spare and reservation.vm.state == "running"
    assert reservation.allocation.host == spare and reservation.allocation.end == reservation.end
    old_vm.refresh_from_db()
    assert old_vm.state == "lost" and old_vm.host == dead and old_vm.allocation.released is not None
    assert not Allocation.objects.filter(host=dead, released__isnull=True).exists()
    trail = [h.reason for h in reservation.history.all()]
    assert any(r.startswith("rebuilding on sim-b: its host sim-a stopped answering") for r in trail), trail
    told = Event.objects.filter(kind="reservation.host_lost")
    assert set(told.values_list("topic", flat=True)) == {f"reservation.{reservation.pk}", "admin", f"user.{alice.pk}"}
    assert {(e.data["outcome"], e.data["host"]) for e in told} == {("rebuilding", "sim-a")}

    # The host returns: it stays drained while the lost VM may be on it; verify shows it, destroy cleans it.
    sim.clear_fault(dead.name)
    refresh(sync_jobs)
    dead.refresh_from_db()
    assert dead.state == "drained" and "1 lost VM(s)" in dead.state_reason
    _, report = run_verify(sync_jobs, admin_user)
    [finding] = [f for f in report.findings if f["kind"] == "unknown"]
    assert finding["key"] == old_vm.key and "has it lost" in finding["message"]
    job = repair.submit("destroy", {"host": "sim-a", "key": old_vm.key}, actor=admin_user, source="test")
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success"
    assert VM.objects.get(pk=old_vm.pk).state == "destroyed" and not SimVM.objects.filter(key=old_vm.key).exists()
    _, report = run_verify(sync_jobs, admin_user)
    assert report.findings == []


def test_the_fail_policy_fails_the_reservation_with_the_reason(make_host, image, alice, sync_jobs):
    image.on_host_failure = "fail"
    image.save()
    dead, reservation = ready_on(make_host, image, alice, sync_jobs)
    make_host("sim-b", cpus=8, memory_mib=8192, disk_gib=200)
    kill(dead)
    refresh(sync_jobs, times=2)
    reservation.refresh_from_db()
    assert reservation.status == "failed", [(j.opcode, j.status, j.error_message) for j in Job.objects.all()]
    assert "sim-a stopped answering" in reservation.error and "policy is to fail" in reservation.error
    assert not Allocation.objects.filter(released__isnull=True).exists()
    assert VM.objects.filter(host__name="sim-b").count() == 0
    assert {e.data["outcome"] for e in Event.objects.filter(kind="reservation.host_lost")} == {"failed"}


def test_no_room_elsewhere_fails_it_with_the_reason_and_nothing_half_done(make_host, image, alice, sync_jobs):
    dead, reservation = ready_on(make_host, image, alice, sync_jobs)
    make_host("sim-tiny", cpus=1, memory_mib=512, disk_gib=5)
    snapshot.expire()
    kill(dead)
    refresh(sync_jobs, times=2)
    reservation.refresh_from_db()
    assert reservation.status == "failed"
    assert "could not be rebuilt elsewhere" in reservation.error and "lack memory" in reservation.error
    assert not Allocation.objects.filter(released__isnull=True).exists()
    assert VM.objects.filter(host__name="sim-tiny").count() == 0
    assert reservation.history.last().reason.startswith("failed: its host sim-a stopped answering")


def test_offline_by_hand_or_unreachable_once_rebuilds_nothing(make_host, image, alice, admin_user, sync_jobs):
    from inventory import services as inventory

    host, reservation = ready_on(make_host, image, alice, sync_jobs)
    make_host("sim-b", cpus=8, memory_mib=8192, disk_gib=200)
    inventory.set_state(host, "offline", "rack move", actor=admin_user)
    sync_jobs.drain()
    reservation.refresh_from_db()
    assert reservation.status == "ready" and reservation.vm.state == "running"
    assert not Job.objects.filter(opcode="node.reprovision").exists()


def test_reprovision_is_staff_only(make_host, image, alice, api, sync_jobs):
    host, _ = ready_on(make_host, image, alice, sync_jobs)
    response = api(alice).post(
        "/api/v1/jobs/", {"opcode": "node.reprovision", "params": {"hypervisor": host.pk}}, format="json"
    )
    assert response.status_code in (400, 403), response.content
    assert not Job.objects.filter(opcode="node.reprovision").exists()
    assert Hypervisor.objects.get(pk=host.pk).state == "online"
