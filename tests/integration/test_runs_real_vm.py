"""Batch runs on a real QEMU VM: a real worker builds the test guest on the private
libvirtd, runs the command through the QEMU guest agent (guest-exec, guest-file-*), keeps its
output and artifacts, and destroys the VM. After each: no domain, no volume, no live claim."""

import json
import signal
import time
from datetime import timedelta

import pytest

from capacity.models import Allocation
from provisioning import services as vms
from runs import services
from runs.models import Run
from tests import processes
from tests.integration import test_real_faults as real_faults
from tests.integration import test_reserve_real_vm as reserve_real
from tests.jobs.helpers import wait_until
from tests.localkvm_inventory import kvm_guest_image

pytestmark = pytest.mark.slow
kvm_host, vm_ids = reserve_real.kvm_host, reserve_real.vm_ids  # the reservation tests' host and VM ids
kvm_hosts = real_faults.kvm_hosts  # kvm_hosts(n): n hosts on the one private libvirtd, a pool each
RUN_TIMEOUT = 400  # s: a boot takes ~10 s alone, but the two cores may be shared with a whole test run


@pytest.fixture
def storage_dir(settings, tmp_path):
    where = tmp_path / "runs"
    settings.STORAGES = {
        **settings.STORAGES,
        "runs": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(where)}},
    }
    return where


@pytest.fixture
def run_worker(transactional_db, tmp_path, storage_dir):
    child = processes.start_worker(
        tmp_path, RUN_STORAGE_DIR=str(storage_dir), RUN_STEP_SECONDS=2, RUN_POLL_SECONDS=0.2, RUN_MIN_SECONDS=5
    )
    yield child
    child.stop()


@pytest.fixture
def guest_os(guest_image):
    return kvm_guest_image(guest_image, "guest-debian", readiness="agent", default_vcpus=1)


def run_to_end(run, worker):
    def ended():
        fresh = Run.objects.get(pk=run.pk)
        return fresh if fresh.is_final else None

    return wait_until(ended, RUN_TIMEOUT, f"run {run.pk} to end", worker, interval=0.3)


def output(run):
    return b"".join(bytes(c.data) for c in run.output.order_by("seq"))


def assert_left_nothing(run, conn, pool):
    vm = run.vm
    assert vm is not None and vm.state == "destroyed", vm and vm.error
    assert vm.key not in [d.name() for d in conn.listAllDomains()]
    pool.pool.refresh(0)
    assert [v.name() for v in pool.pool.listAllVolumes() if v.name().startswith(vm.key)] == []
    assert not Allocation.objects.filter(released__isnull=True).exists()


def submit(user, **kwargs):
    kwargs.setdefault("time_limit", 120)
    return services.submit(actor=user, owner=user, platform="debian-12-test-guest", **kwargs)


def test_runs_exit_0_and_3_with_their_output_and_leave_nothing(
    run_worker, alice, kvm_host, guest_os, libvirt_conn, guest_image
):
    _host, pool = kvm_host
    started = time.monotonic()
    command = "echo hello from $(uname -s); echo $GREETING; cat /proc/cmdline"
    ok = run_to_end(submit(alice, argv=["/bin/sh", "-c", command], env={"GREETING": "hi there"}), run_worker)
    first = time.monotonic() - started
    assert ok.state == "success", (ok.reason, run_worker.output()[-3000:])
    assert ok.exit_status == 0
    # The image's own command line, as given: booted by its kernel, not by SYSLINUX (which
    # would have added BOOT_IMAGE= and initrd=).
    assert output(ok) == b"hello from Linux\nhi there\n" + guest_image["cmdline"].encode() + b"\n"
    assert any(".kernel-" in v.name() for v in pool.pool.listAllVolumes())  # staged beside the disk
    assert_left_nothing(ok, libvirt_conn, pool)

    failed = run_to_end(submit(alice, script="echo failing >&2\nexit 3\n"), run_worker)
    assert failed.state == "error" and failed.exit_status == 3, failed.reason
    assert output(failed) == b"failing\n" and "exited with status 3" in failed.error
    assert_left_nothing(failed, libvirt_conn, pool)
    print(f"\nsubmit to end of the first run (image staged): {first:.1f} s")


def test_an_input_file_goes_in_and_an_artifact_comes_out(run_worker, alice, kvm_host, guest_os, libvirt_conn):
    _host, pool = kvm_host
    script = "mkdir -p out && tr a-z A-Z < data/in.txt > out/result.xml && printf '\\377\\376 raw\\n'"
    run = run_to_end(
        submit(alice, argv=["/bin/sh", "-c", script], inputs={"data/in.txt": b"shout\n"}, artifacts=["out/*.xml"]),
        run_worker,
    )
    assert run.state == "success", (run.reason, run_worker.output()[-3000:])
    assert output(run) == b"\xff\xfe raw\n"  # not UTF-8: kept as bytes
    [artifact] = run.files.filter(kind="artifact")
    assert artifact.path == "out/result.xml"
    assert services.storage().open(artifact.stored).read() == b"SHOUT\n"
    assert_left_nothing(run, libvirt_conn, pool)


def test_a_run_past_its_time_limit_is_killed_and_its_vm_destroyed(run_worker, alice, kvm_host, guest_os, libvirt_conn):
    _host, pool = kvm_host
    run = run_to_end(submit(alice, argv=["/bin/sh", "-c", "echo started; sleep 600"], time_limit=10), run_worker)
    assert run.state == "error" and run.exit_status is None, run.reason
    assert "time limit of 10 s" in run.error and output(run) == b"started\n"
    assert_left_nothing(run, libvirt_conn, pool)


def test_a_pooled_images_second_run_starts_on_the_reverted_vm(run_worker, alice, bob, kvm_host, guest_os, libvirt_conn):
    """The first run's VM is booted, snapshotted warm (memory included, nothing of the run in it
    yet), runs its command (which writes a file), and is reverted to its clean snapshot and
    parked; the second run (another user) gets that VM back at its warm snapshot: the same boot
    (its boot id), without the file. Then the parked VM is destroyed: nothing left."""
    from provisioning.models import VM
    from tests.integration.test_real_vm_ops import run_job

    _host, pool = kvm_host
    vms.update_image(guest_os, actor="test", pool_size=1)
    boot_id = "cat /proc/sys/kernel/random/boot_id"
    began = time.monotonic()
    first = run_to_end(
        submit(alice, argv=["/bin/sh", "-c", f"echo secret > /root/left-behind; sync; {boot_id}"]), run_worker
    )
    fresh_s = time.monotonic() - began
    assert first.state == "success", (first.reason, run_worker.output()[-3000:])
    parked = VM.objects.get(pk=first.vm_id)
    assert parked.state == "stopped" and parked.owner is None and vms.is_parked_claim(parked.allocation)
    assert vms.has_warm_snapshot(parked), parked.snapshots
    assert parked.key in [d.name() for d in libvirt_conn.listAllDomains()]  # kept defined, shut off
    check = f"test -e /root/left-behind && echo still there || echo gone; {boot_id}"
    began = time.monotonic()
    second = run_to_end(submit(bob, argv=["/bin/sh", "-c", check]), run_worker)
    pooled_s = time.monotonic() - began
    assert second.state == "success", (second.reason, run_worker.output()[-3000:])
    assert second.vm_id == first.vm_id
    assert any(
        entry[1].startswith(f"started on a pooled VM {parked.key}") and "no boot" in entry[1] for entry in second.reason
    ), second.reason
    gone, second_boot = output(second).decode().split()
    assert gone == "gone"
    assert second_boot == output(first).decode().strip()  # the same boot: resumed, not booted again
    live = Allocation.objects.filter(released__isnull=True)
    assert [a.pk for a in live] == [VM.objects.get(pk=parked.pk).allocation_id]  # its disk claim alone
    run_job(vms.submit_action(VM.objects.get(pk=parked.pk), "destroy", actor="test").pk, run_worker)
    assert_left_nothing(Run.objects.get(pk=second.pk), libvirt_conn, pool)
    print(f"\nsubmit to end: fresh VM (boot + warm snapshot) {fresh_s:.1f} s, pooled VM (no boot) {pooled_s:.1f} s")


# --- suspend instead of preempt -------------------------------------------------

# Each run remembers its guest's boot id and a value in its shell while it waits for a file
# the test writes into the guest once the run has resumed (a fixed sleep would have to outlast
# the slowest suspend): the same boot and the value prove it was not rebooted or rerun.
BOOT = "echo boot $(cat /proc/sys/kernel/random/boot_id)"
GATE = "/tmp/vclmgr-test-go"
SLEEPER = f"{BOOT}; n=6; while [ ! -e {GATE} ]; do sleep 1; done; {BOOT}; echo $((n * 7))\n"


def let_go(run, worker, conn, host=None):
    """Once ``run`` runs again (on ``host``, if given), write the gate file in its guest through
    the guest agent (the run's own command goes on beside it)."""
    import libvirt
    import libvirt_qemu

    def resumed():
        fresh = Run.objects.get(pk=run.pk)
        assert not fresh.is_final, fresh.reason
        return fresh if fresh.state == "running" and (host is None or fresh.vm.host == host) else None

    fresh = wait_until(resumed, RUN_TIMEOUT, f"run {run.pk} to run again", worker, interval=0.3)
    command = json.dumps({"execute": "guest-exec", "arguments": {"path": "/bin/sh", "arg": ["-c", f": > {GATE}"]}})

    def written():
        try:
            return libvirt_qemu.qemuAgentCommand(conn.lookupByName(fresh.vm.key), command, 5, 0)
        except libvirt.libvirtError:  # its agent not back yet after the restore
            return None

    wait_until(written, 60, f"the gate file in run {run.pk}'s guest", worker, interval=0.5)


@pytest.fixture
def workers(transactional_db, tmp_path, storage_dir):
    """Three workers: two runs wait on their commands while the reservation's jobs go on."""
    child = processes.start_worker(
        tmp_path,
        workers=3,
        RUN_STORAGE_DIR=str(storage_dir),
        RUN_STEP_SECONDS=2,
        RUN_POLL_SECONDS=0.2,
        RUN_MIN_SECONDS=5,
    )
    yield child
    child.stop()


def test_a_reservation_that_fits_only_if_two_runs_are_suspended_gets_its_vm_and_the_runs_resume_after_it(
    workers, alice, bob, kvm_host, guest_os, libvirt_conn
):
    """The host (768 MiB here) holds two low runs of 320 MiB; a reservation of 512 MiB fits only
    once both are suspended: it becomes ready with both suspended to disk (managedsave), and
    when it ends they resume on the same host and print what they were going to print."""
    from inventory import services as inventory
    from reservations import services as reservations
    from reservations.models import Reservation

    host, pool = kvm_host
    inventory.update_hypervisor(host, actor="test", memory_mib=768)
    started = time.monotonic()
    runs = [submit(alice, script=SLEEPER, priority="low", memory_mib=320, time_limit=300) for _ in range(2)]

    def all_running():
        return all(Run.objects.get(pk=r.pk).state == "running" for r in runs) or None

    wait_until(all_running, RUN_TIMEOUT, "both runs to run", workers, interval=0.3)
    booted = time.monotonic()
    reservation = reservations.reserve(bob, guest_os, actor=bob, duration=timedelta(hours=1), size={"memory_mib": 512})
    assert any("suspending 2 low runs" in h.reason for h in reservation.history.all())

    def ready():
        fresh = Reservation.objects.get(pk=reservation.pk)
        assert fresh.status not in ("failed", "canceled"), fresh.error
        return fresh if fresh.status == "ready" else None

    wait_until(ready, RUN_TIMEOUT, "the reservation to be ready", workers, interval=0.3)
    reserved = time.monotonic()
    for run in runs:
        run = Run.objects.get(pk=run.pk)
        assert run.state == "suspended", (run.reason, workers.output()[-3000:])
        assert libvirt_conn.lookupByName(run.vm.key).hasManagedSaveImage(0)  # its memory is on disk
        assert vms.is_suspended_claim(run.vm.allocation)

    reservations.end(Reservation.objects.get(pk=reservation.pk), actor=bob)
    for run in runs:
        let_go(run, workers, libvirt_conn)
    ends = [run_to_end(run, workers) for run in runs]
    done = time.monotonic()
    for run in ends:
        assert run.state == "success", (run.reason, workers.output()[-3000:])
        first, second, value = output(run).decode().splitlines()
        assert first == second and first.startswith("boot ") and value == "42"  # the same boot, the same shell
        trail = " ".join(entry[1] for entry in run.reason)
        for said in ("to be suspended (low class)", "suspended: its VM", "resumed on kvm-local"):
            assert said in trail, run.reason
        assert run.suspended_seconds > 0
        assert_left_nothing(run, libvirt_conn, pool)
    assert Reservation.objects.get(pk=reservation.pk).status == "ended"
    print(
        f"\nruns running after {booted - started:.1f} s; reservation ready {reserved - booted:.1f} s later "
        f"(two runs suspended); runs done {done - reserved:.1f} s after that"
    )


def wait_running(run, worker, printed=b""):
    """Until the command runs in the guest and has printed ``printed``."""

    def running():
        fresh = Run.objects.get(pk=run.pk)
        assert not fresh.is_final, fresh.reason
        return fresh if fresh.state == "running" and output(fresh).startswith(printed) and fresh.output_seen else None

    return wait_until(running, RUN_TIMEOUT, f"run {run.pk} to print {printed!r}", worker, interval=0.3)


def test_two_megabytes_of_output_are_counted_and_kept_up_to_the_limit(
    transactional_db, alice, kvm_host, guest_os, libvirt_conn, tmp_path, storage_dir
):
    """The guest prints 2 MiB; the worker keeps 1 MiB (its limit) and counts every byte."""
    _host, pool = kvm_host
    worker = processes.start_worker(
        tmp_path,
        RUN_STORAGE_DIR=str(storage_dir),
        RUN_STEP_SECONDS=2,
        RUN_POLL_SECONDS=0.2,
        RUN_MIN_SECONDS=5,
        RUN_OUTPUT_MAX_BYTES=1 << 20,
    )
    try:
        run = run_to_end(submit(alice, argv=["/bin/sh", "-c", "head -c 2097152 /dev/zero | tr '\\000' x"]), worker)
        assert run.state == "success", (run.reason, worker.output()[-3000:])
    finally:
        worker.stop()
    assert run.output_seen == 2 << 20 and run.output_kept == 1 << 20 and run.truncated
    assert output(run) == b"x" * (1 << 20)
    assert_left_nothing(run, libvirt_conn, pool)


def test_a_run_canceled_while_its_command_runs_ends_canceled_and_leaves_nothing(
    run_worker, alice, kvm_host, guest_os, libvirt_conn
):
    _host, pool = kvm_host
    run = submit(alice, argv=["/bin/sh", "-c", "echo started; sleep 600"], time_limit=900)
    wait_running(run, run_worker, b"started\n")
    services.cancel(run, actor=alice)
    run = run_to_end(run, run_worker)
    assert run.state == "canceled" and run.exit_status is None, run.reason
    assert output(run) == b"started\n"
    assert any("canceled" in entry[1] for entry in run.reason), run.reason
    assert_left_nothing(run, libvirt_conn, pool)


def test_a_run_whose_worker_is_sigkilled_resumes_on_another_and_prints_everything_once(
    transactional_db, alice, kvm_host, guest_os, libvirt_conn, tmp_path, storage_dir
):
    """SIGKILL the whole worker (every process of its group) while the command runs; a new
    worker recovers the job once its lease expires, reads on from the recorded offset (the
    command went on in the guest meanwhile) and destroys the VM."""
    from jobs import services as jobs

    _host, pool = kvm_host
    jobs.set_queue_settings(actor="test", lease_seconds=4)
    env = {"RUN_STORAGE_DIR": str(storage_dir), "RUN_STEP_SECONDS": 2, "RUN_POLL_SECONDS": 0.2, "RUN_MIN_SECONDS": 5}
    (tmp_path / "first").mkdir()
    first = processes.start_worker(tmp_path / "first", **env)
    try:
        run = submit(alice, argv=["/bin/sh", "-c", "echo one; sleep 12; echo two"], time_limit=300)
        wait_running(run, first, b"one\n")
    finally:
        first.stop(signal.SIGKILL)  # the leader and then its whole group: no clean shutdown
    assert Run.objects.get(pk=run.pk).state == "running"
    second = processes.start_worker(tmp_path, **env)
    try:
        run = run_to_end(run, second)
    finally:
        second.stop()
    assert run.state == "success" and run.exit_status == 0, (run.reason, second.output()[-3000:])
    assert output(run) == b"one\ntwo\n"  # nothing lost, nothing read twice
    assert_left_nothing(run, libvirt_conn, pool)


def test_a_suspended_run_resumes_on_another_host_after_one_refused_it_and_prints_what_it_kept(
    workers, alice, bob, kvm_hosts, guest_os, libvirt_conn
):
    """A low run on kvm-0 (room for one run) is suspended by a high run; kvm-0 is drained, so
    it is to resume elsewhere. kvm-1 refuses it (its storage pool is gone): the run stays
    suspended on kvm-0, intact, and its trail says why; kvm-2 then takes it: its VM moves there
    with its saved memory (libvirt cannot migrate a managed save: the memory goes through the
    pools), resumes, and the command prints what it kept while it waited. Nothing is left on
    any host: no domain, no volume (no saved memory either), no claim."""
    from capacity.snapshot import snapshot
    from inventory import services as inventory
    from jobs.models import Job

    hosts = kvm_hosts(3)
    (first, _pool0), (refusing, pool1), (spare, _pool2) = hosts
    inventory.update_hypervisor(first, actor="test", memory_mib=600)
    for host in (refusing, spare):
        inventory.set_state(host, "drained", "not yet", actor="test")
    low = submit(alice, script=SLEEPER, priority="low", memory_mib=320, time_limit=300)
    wait_running(low, workers, b"boot ")
    high = submit(bob, argv=["/bin/sh", "-c", "sleep 5; echo high"], priority="high", memory_mib=320)

    def suspended():
        run = Run.objects.get(pk=low.pk)
        assert not run.is_final, (run.reason, workers.output()[-3000:])
        return run if run.state == "suspended" else None

    def resumed_by_a_new_job(last):
        """Until a new ``run.resume`` job has the run (ours, or a worker's housekeeping's)."""

        def handed_over():
            snapshot.expire()
            services.resume_suspended(actor="test")  # none while the last job has not ended yet
            job = Run.objects.get(pk=low.pk).job
            return job if job != last and Job.objects.filter(pk=job, opcode="run.resume").exists() else None

        return wait_until(handed_over, 60, "a run.resume job", workers, interval=0.5)

    suspending = wait_until(suspended, RUN_TIMEOUT, "the low run to be suspended", workers, interval=0.3).job
    inventory.set_state(first, "drained", "maintenance: its suspended run resumes elsewhere", actor="test")
    pool1.pool.destroy()  # its storage pool gone: kvm-1 can take nothing
    inventory.set_state(refusing, "online", "back", actor="test")
    refused_job = resumed_by_a_new_job(suspending)

    def refused():
        run = Run.objects.get(pk=low.pk)
        return run if Job.objects.get(pk=refused_job).is_final else None

    run = wait_until(refused, RUN_TIMEOUT, "the move to kvm-1 to fail", workers, interval=0.3)
    assert "could not be moved to kvm-1" in run.reason[-1][1], run.reason
    assert run.state == "suspended" and "storage pool" in run.reason[-1][1], run.reason
    assert run.reason[-1][1].endswith("still suspended on kvm-0, it resumes when room returns")
    vm = run.vm
    assert vm.host == first and vm.state == "suspended" and vms.is_suspended_claim(vm.allocation)
    assert libvirt_conn.lookupByName(vm.key).hasManagedSaveImage(0)  # its memory where it was
    assert [v for v in hosts[0][1].volumes() if v.startswith(vm.key)] == [f"{vm.key}.qcow2"]  # no saved memory
    assert not Allocation.objects.filter(released__isnull=True, host=refusing).exists()

    inventory.set_state(spare, "online", "back", actor="test")
    resumed_by_a_new_job(refused_job)  # not kvm-1 again: kvm-2
    let_go(low, workers, libvirt_conn, host=spare)
    run = run_to_end(low, workers)
    assert run.state == "success", (run.reason, workers.output()[-3000:])
    first_boot, second_boot, value = output(run).decode().splitlines()
    assert first_boot == second_boot and value == "42"  # the same boot, the same shell, on another host
    trail = " ".join(entry[1] for entry in run.reason)
    for said in ("to be suspended (low class)", "room on kvm-2: moving it there to resume", "resumed on kvm-2"):
        assert said in trail, run.reason
    assert run.vm.host == spare
    other = run_to_end(high, workers)
    assert other.state == "success" and output(other) == b"high\n", other.reason
    for done in (run, other):
        assert done.vm.state == "destroyed"
        assert done.vm.key not in [d.name() for d in libvirt_conn.listAllDomains()]
        for _host, pool in hosts[::2]:  # (kvm-1's pool is gone)
            assert [v for v in pool.volumes() if v.startswith(done.vm.key)] == [], pool.name
    assert not Allocation.objects.filter(released__isnull=True).exists()
