"""A reservation's build that ends other than in success still settles it: no settle
job waits for every build; the transaction that ends a build otherwise — failed in its opcode,
canceled (queued or between steps), given up after its workers were lost — queues
``reservation.settle``, which retries elsewhere or fails the reservation."""

from datetime import timedelta

import pytest
from django.utils import timezone

from capacity.models import Allocation
from drivers.sim import services as sim
from jobs import dispatcher, tasks
from jobs import services as jobs
from jobs.models import Job, QueueSettings
from provisioning.models import VM
from provisioning.opcodes import lifecycle
from reservations import services
from reservations.models import Reservation

pytestmark = pytest.mark.django_db
H = timedelta(hours=1)


def _reserve(user, image):
    return services.reserve(user, image, actor=user, duration=2 * H)


def _settle_jobs(reservation):
    return Job.objects.filter(opcode="reservation.settle", params__reservation=reservation.pk)


def test_a_build_failing_in_its_opcode_queues_the_settle_job_as_it_ends(sim_host, image, alice, sync_jobs):
    reservation = _reserve(alice, image)
    sim.set_fault(sim_host.name, "start", "fail")
    build = Job.objects.get(opcode="vm.create")
    sync_jobs.run_one()  # the build alone: it fails (no other host for its retry)
    build.refresh_from_db()
    assert build.status == "error"
    settle = _settle_jobs(reservation).get()
    assert settle.status == "queued"  # queued by the build's end (run_one ran the build only)
    assert f"job {build.pk}, ended error" in str(settle.reason)
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert reservation.status == "failed" and "no other host" in reservation.error
    assert Job.objects.get(pk=settle.pk).status == "success"
    assert Allocation.objects.get(pk=reservation.allocation_id).released is not None


def test_a_build_retried_on_another_host_by_its_settle_job_makes_the_reservation_ready(
    make_host, image, alice, sync_jobs
):
    hosts = [make_host(f"sim-{n}", cpus=8, memory_mib=8192, disk_gib=200) for n in (1, 2)]
    reservation = _reserve(alice, image)
    for host in hosts:  # the build's own retry fails too; the settle job's comes after the fault is gone
        sim.set_fault(host.name, "start", "fail")
    sync_jobs.run_one()
    for host in hosts:
        sim.clear_fault(host.name)
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert reservation.status == "ready" and reservation.attempts == 2
    assert _settle_jobs(reservation).get().status == "success"
    assert list(Job.objects.filter(opcode="vm.create").order_by("pk").values_list("status", flat=True)) == [
        "error",
        "success",
    ]


def test_a_canceled_queued_build_queues_the_settle_job_in_the_cancel_s_transaction(sim_host, image, alice, sync_jobs):
    reservation = _reserve(alice, image)
    first_vm = reservation.vm_id
    build = Job.objects.get(opcode="vm.create")
    jobs.cancel(build, actor="staff", reason="not now")
    assert Job.objects.get(pk=build.pk).status == "canceled"
    assert _settle_jobs(reservation).get().status == "queued"
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert _settle_jobs(reservation).get().status == "success"
    # Settled: built again on a fresh VM (the canceled build never touched a host).
    assert reservation.status == "ready" and reservation.vm_id != first_vm and reservation.attempts == 2


def test_a_build_canceled_between_steps_queues_the_settle_job(sim_host, image, alice, sync_jobs, monkeypatch):
    reservation = _reserve(alice, image)
    build = Job.objects.get(opcode="vm.create")
    define = lifecycle.define

    def define_then_cancel(vm_id, **kwargs):
        done = define(vm_id, **kwargs)
        jobs.cancel(Job.objects.get(pk=build.pk), actor="staff")  # stops before the next step
        return done

    monkeypatch.setattr(lifecycle, "define", define_then_cancel)
    sync_jobs.run_one()
    monkeypatch.undo()
    assert Job.objects.get(pk=build.pk).status == "canceled"
    assert VM.objects.get(pk=reservation.vm_id).state == "failed"  # cleaned up as the cancel stopped it
    assert _settle_jobs(reservation).get().status == "queued"
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert _settle_jobs(reservation).get().status == "success"
    assert reservation.status == "failed" and "no other host" in reservation.error  # its only host failed


def test_a_build_given_up_after_its_worker_was_lost_queues_the_settle_job(sim_host, image, alice, sync_jobs):
    reservation = _reserve(alice, image)
    build = Job.objects.get(opcode="vm.create")
    claim = dispatcher.claim_next(runner="lost:1")
    assert claim is not None and claim.id == build.pk
    # The worker died half-way through the build, on its last attempt, and its lease ran out.
    VM.objects.filter(pk=reservation.vm_id).update(state="defining", host=sim_host)
    Job.objects.filter(pk=build.pk).update(
        attempt=QueueSettings.lock().max_attempts, lease_until=timezone.now() - timedelta(seconds=1)
    )
    assert tasks.recover_expired() == 1
    build.refresh_from_db()
    assert build.status == "error" and build.error_kind == "lost"
    assert _settle_jobs(reservation).get().status == "queued"
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert _settle_jobs(reservation).get().status == "success"
    # It may have been half made on its host: in error, its claim kept, until the destroy that
    # the settle queued (the build's own undo, which never ran) removed it.
    vm = VM.objects.get(pk=build.params["vm"])
    destroy = Job.objects.get(opcode="vm.destroy", params__vm=vm.pk)
    assert destroy.status == "success" and "its build ended unfinished" in str(destroy.reason)
    assert vm.state == "destroyed" and "its build ended with the VM defining" in vm.error
    assert vm.allocation.released is not None
    assert reservation.status == "failed" and "no other host" in reservation.error  # the only host failed


def test_a_settle_job_while_a_build_of_its_vm_is_pending_waits(sim_host, image, alice, sync_jobs):
    reservation = _reserve(alice, image)
    VM.objects.filter(pk=reservation.vm_id).update(state="defining", host=sim_host)  # a build resumed later
    result = services.settle(reservation.pk, actor="test")
    assert result == {"status": "provisioning", "vm": "defining"}
    assert VM.objects.get(pk=reservation.vm_id).state == "defining"


def test_an_ad_hoc_vm_s_failed_build_queues_nothing(sim_host, image, admin_user, sync_jobs):
    from provisioning import services as vms

    sim.set_fault(sim_host.name, "start", "fail")
    vms.request_vm(actor=admin_user, owner=admin_user, image=image)
    sync_jobs.drain()
    assert Job.objects.get(opcode="vm.create").status == "error"
    assert not Job.objects.filter(opcode="reservation.settle").exists()
