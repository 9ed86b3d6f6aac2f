"""A reservation's VM resized by an operator: the reservation holds the new size and claim."""

from datetime import timedelta

from capacity.models import Allocation
from jobs.models import Job
from provisioning import resizing
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
