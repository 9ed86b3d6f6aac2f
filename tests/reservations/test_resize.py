"""A reservation's VM resized by an operator: the reservation holds the new size and claim."""

from datetime import timedelta

from capacity.models import Allocation
from drivers.base import DriverError
from drivers.sim.models import SimVM
from jobs.models import Job
from provisioning import resizing
from provisioning import services as vms
from provisioning.models import VM
from provisioning.opcodes import resize as resize_op
from reservations import services
from reservations.models import Reservation

H = timedelta(hours=1)


def test_a_reservation_follows_its_vms_new_size_and_claim(sim_host, image, alice, admin_user, sync_jobs):
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H, size={"memory_mib": 1024})
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert reservation.status == "ready", reservation.error

    job = resizing.resize(reservation.vm, actor=admin_user, vcpus=2, memory_mib=2048)
    sync_jobs.drain()

    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
    reservation = Reservation.objects.get(pk=reservation.pk)
    vm = reservation.vm
    assert (reservation.vcpus, reservation.memory_mib) == (vm.vcpus, vm.memory_mib) == (2, 2048)
    assert reservation.allocation_id == vm.allocation_id and reservation.allocation.memory_mib == 2048
    extended = services.extend(reservation, reservation.end + H, actor=alice)
    assert (extended.allocation.memory_mib, extended.allocation.end) == (2048, extended.end)
    assert list(Allocation.objects.filter(released__isnull=True).values_list("pk", flat=True)) == [
        extended.allocation_id
    ]


def _extend_then_fail(reservation, alice):
    """``apply`` as a host refusing the new size, after the user extended their reservation
    meanwhile (an extension takes no VM lock: it moves the claim the job resized)."""

    def apply(vm_id, size):
        current = Reservation.objects.get(pk=reservation.pk)
        services.extend(current, current.end + H, actor=alice)
        raise DriverError("host said no", permanent=True)

    return apply


def test_a_failed_growth_is_undone_on_the_claim_an_extension_moved_it_to(
    sim_host, image, alice, admin_user, sync_jobs, monkeypatch
):
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H, size={"memory_mib": 1024})
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert reservation.status == "ready", reservation.error
    monkeypatch.setattr(resize_op, "apply", _extend_then_fail(reservation, alice))

    job = resizing.resize(reservation.vm, actor=admin_user, memory_mib=4096)
    sync_jobs.drain()

    assert Job.objects.get(pk=job.pk).status == "error"
    reservation = Reservation.objects.get(pk=reservation.pk)
    vm = reservation.vm
    live = list(Allocation.objects.filter(released__isnull=True))
    assert [claim.pk for claim in live] == [vm.allocation_id] == [reservation.allocation_id]
    assert vm.memory_mib == vm.allocation.memory_mib == reservation.memory_mib == 1024
    assert vm.allocation.end == reservation.end  # the extension stands


def test_a_failed_shrink_is_undone_on_the_claim_an_extension_moved_it_to(
    sim_host, image, alice, admin_user, sync_jobs, monkeypatch
):
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H, size={"memory_mib": 4096})
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    vms.submit_action(reservation.vm, "stop", actor="test")
    sync_jobs.drain()
    monkeypatch.setattr(resize_op, "apply", _extend_then_fail(reservation, alice))

    job = resizing.resize(VM.objects.get(pk=reservation.vm_id), actor=admin_user, memory_mib=1024)
    sync_jobs.drain()

    assert Job.objects.get(pk=job.pk).status == "error"
    vm = VM.objects.get(pk=reservation.vm_id)
    assert SimVM.objects.get(key=vm.key).memory_mib == vm.memory_mib == vm.allocation.memory_mib == 4096
    assert Allocation.objects.filter(released__isnull=True).count() == 1
