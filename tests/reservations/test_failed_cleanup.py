"""A claim is given back only when its VM is known gone: a VM the simulator
could not remove keeps its host's room claimed, past the reservation's end, until repaired."""

from datetime import timedelta

from django.utils import timezone

from capacity import loaders
from capacity.models import Allocation
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from provisioning import services as vms
from provisioning.models import VM
from reservations import services
from reservations.models import Reservation

H = timedelta(hours=1)


def fresh(reservation):
    return Reservation.objects.get(pk=reservation.pk)


def counted_on(host, at):
    """Claims the placement snapshot counts on ``host`` at ``at`` (what a new claim sees)."""
    return [row for row in loaders.live_allocations(at, [host.pk])]


def test_a_failed_build_whose_cleanup_fails_keeps_both_hosts_claimed(make_host, image, alice, sync_jobs):
    hosts = [make_host(f"sim-{n}", cpus=8, memory_mib=8192, disk_gib=200) for n in (1, 2)]
    for host in hosts:
        sim.set_fault(host.name, "start", "fail")
        sim.set_fault(host.name, "destroy", "unreachable")
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H)
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "failed" and reservation.attempts == 2
    built = VM.objects.filter(image=image).order_by("pk")
    assert [vm.state for vm in built] == ["error", "error"]
    assert all("cleanup failed" in vm.error and "unreachable" in vm.error for vm in built)
    # Both VMs are still on their hosts, so both hosts keep the room claimed, with no end.
    assert SimVM.objects.count() == 2
    after_end = reservation.end + H
    for vm in built:
        assert vm.allocation.released is None and vm.allocation.end is None and vm.allocation.host == vm.host
        assert len(counted_on(vm.host, after_end)) == 1
    assert Allocation.objects.get(pk=reservation.allocation_id).released is not None  # replaced by the VM's hold


def test_a_retry_elsewhere_keeps_the_first_hosts_claim_while_its_vm_is_there(make_host, image, alice, sync_jobs):
    make_host("sim-1", cpus=8, memory_mib=8192, disk_gib=200)
    make_host("sim-2", cpus=8, memory_mib=8192, disk_gib=200)
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H)
    bad = reservation.allocation.host
    sim.set_fault(bad.name, "start", "fail")
    sim.set_fault(bad.name, "destroy", "fail")
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ready", reservation.error
    assert reservation.vm.host != bad
    stuck = VM.objects.get(host=bad)
    assert stuck.state == "error" and stuck.allocation.released is None and stuck.allocation.end is None
    assert len(counted_on(bad, reservation.end + H)) == 1
    # Once the host answers again, destroying the stuck VM gives its room back.
    sim.clear_fault(bad.name)
    vms.submit_action(stuck, "destroy", actor="staff")
    sync_jobs.drain()
    assert VM.objects.get(pk=stuck.pk).state == "destroyed"
    assert counted_on(bad, timezone.now()) == []


def test_an_end_whose_destroy_fails_keeps_the_claim(sim_host, image, alice, sync_jobs):
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H)
    sync_jobs.drain()
    sim.set_fault(sim_host.name, "destroy", "unreachable")
    services.end(fresh(reservation), actor=alice)
    sync_jobs.drain()
    reservation = fresh(reservation)
    assert reservation.status == "ended"
    assert "capacity stays claimed" in reservation.history.last().reason
    vm = VM.objects.get(pk=reservation.vm_id)
    assert vm.state == "error" and "destroy failed" in vm.error
    assert SimVM.objects.filter(key=vm.key).exists()
    assert vm.allocation.released is None and vm.allocation.end is None
    assert len(counted_on(sim_host, reservation.end + H)) == 1


def test_an_end_whose_destroy_succeeds_releases_the_claim(sim_host, image, alice, sync_jobs):
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H)
    sync_jobs.drain()
    SimVM.objects.all().delete()  # gone behind our back: the driver says it is not there, which is gone
    services.end(fresh(reservation), actor=alice)
    sync_jobs.drain()
    assert fresh(reservation).status == "ended" and fresh(reservation).vm.state == "destroyed"
    assert not Allocation.objects.filter(released__isnull=True).exists()
