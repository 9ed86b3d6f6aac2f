"""Live migration of a running guest between two real KVM hosts on this machine
(``tests/twohosts.py``: two private libvirtd daemons in namespaces of their own), through
vclmgr's own ``vm.migrate`` job, proven from inside the guest: the same boot, the same
process, and an SSH session opened before the move still answering after it.

- Over shared storage, with a snapshot (its definition handed over); then its new host is
  evacuated (``node.evacuate``) and it comes back live, the SSH session still open.
- With its disk copied: first a move whose target's libvirtd is killed mid-way (the guest runs
  on at the source, the target's claim goes back, the job says why), then the move, then,
  stopped, back offline with its disk.

The guest's NIC is on the segment both hosts see, so its address and TCP connections stay
valid on the target (QEMU announces the moved NIC, the bridges learn where it is now). vclmgr
waits for the guest agent rather than the login port: vclmgr runs outside the hosts'
namespaces and does not reach the guests' segment; the SSH session is opened from host A's.
"""

import threading
import time

import libvirt
import pytest

from capacity.models import Allocation
from drivers import registry as drivers
from drivers.base import VMState
from inventory.models import Hypervisor
from jobs import services as jobs
from jobs.models import Job
from provisioning import services
from provisioning.models import VM
from tests import realvm
from tests.jobs.conftest import sync_jobs  # noqa: F401 (fixture)
from tests.localkvm_inventory import kvm_guest_image, two_kvm_hosts

pytestmark = pytest.mark.slow
AGENT_SECONDS = 240  # a boot under software emulation on shared cores
SLOW_MIB_S = 8  # the failed migration's bandwidth: ~88 MiB of memory to send, ~10 s
MARK_AT = 200_000  # 512-byte sector: ~100 MiB into the disk, past the 64 MiB base image


def drained(jobs, job, budget=AGENT_SECONDS):
    jobs.drain(budget=budget)
    job = Job.objects.get(pk=job.pk)
    assert job.status == "success", f"{job.opcode}: {job.error_message}"
    return job


def guest_run(driver, key, tag, command):
    """``command`` in the guest through its agent (once it answers); → its output once it has exited."""
    deadline = time.monotonic() + AGENT_SECONDS
    while not driver.agent_answers(key):
        assert time.monotonic() < deadline, f"no guest agent on {key}"
        time.sleep(0.2)
    driver.guest_exec(key, tag, ["/bin/sh", "-c", command])
    while not (status := driver.guest_exec_status(key, tag, 0)).exited:
        assert time.monotonic() < deadline, f"{command}: still running"
        time.sleep(0.2)
    assert status.exit_status == 0, status.output
    return status.output.decode()


def ssh_output(client, command):
    _, stdout, stderr = client.exec_command(command, timeout=60)
    out = stdout.read().decode()
    assert stdout.channel.recv_exit_status() == 0, stderr.read().decode()
    return out


@pytest.fixture
def guest(guest_image):
    return kvm_guest_image(guest_image, "guest-debian", readiness="agent")


def test_a_running_guest_moves_live_over_shared_storage_with_its_processes_and_ssh_session(
    two_hosts,
    admin_user,
    sync_jobs,  # noqa: F811
    guest,
):
    host_a, host_b = two_kvm_hosts(two_hosts, shared=True)
    services.update_image(guest, actor="test", revert_on_end=True)  # its VMs get a snapshot: "clean"
    user = realvm.new_login()
    vm, job = services.request_vm(actor=admin_user, owner=admin_user, image=guest, ssh_key=user["public"])
    drained(sync_jobs, job)
    vm = VM.objects.get(pk=vm.pk)
    source, target = (host_a, host_b) if vm.host_id == host_a.pk else (host_b, host_a)
    here, there = drivers.driver_for(source), drivers.driver_for(target)
    boot = guest_run(here, vm.key, "boot", "cat /proc/sys/kernel/random/boot_id")
    pid = guest_run(here, vm.key, "sleeper", "sleep 10000 </dev/null >/dev/null 2>&1 & echo $!").strip()
    assert vm.address and vm.address.startswith(f"{two_hosts.a.address.rsplit('.', 1)[0]}.")
    session = two_hosts.ssh(two_hosts.a, vm.address, "admin", pkey=user["pkey"])
    try:
        assert ssh_output(session, f"cat /proc/{pid}/comm").strip() == "sleep"
        old_claim = vm.allocation

        job = services.submit_action(vm, "migrate", actor=admin_user, target=target.pk)
        job = drained(sync_jobs, job)

        vm = VM.objects.get(pk=vm.pk)
        assert (vm.state, vm.host_id) == ("running", target.pk)
        assert (here.state(vm.key), there.state(vm.key)) == (VMState.ABSENT, VMState.RUNNING)
        assert there.conn.lookupByName(vm.key).snapshotListNames(0) == ["clean"]  # its definition handed over
        assert guest_run(there, vm.key, "boot-after", "cat /proc/sys/kernel/random/boot_id") == boot
        assert guest_run(there, vm.key, "sleeper-after", f"cat /proc/{pid}/comm").strip() == "sleep"
        # The same TCP connection, opened before the move
        assert ssh_output(session, f"cat /proc/{pid}/comm; cat /proc/sys/kernel/random/boot_id").split() == [
            "sleep",
            boot.strip(),
        ]
        migration = job.result["migration"]
        assert 0 < migration["downtime_ms"] < migration["total_ms"] and migration["memory_bytes"] > 0, migration
        assert Allocation.objects.get(pk=old_claim.pk).released is not None
        assert vm.allocation.host_id == target.pk and vm.allocation.released is None and vm.target_allocation is None
        print(f"\nlive migration over shared storage: {migration}")

        # Patch day: the host it is on now is evacuated, and the guest comes back live
        evacuation = drained(sync_jobs, jobs.submit("node.evacuate", {"hypervisor": target.pk}, actor="test"))
        [back] = Job.objects.filter(pk__in=evacuation.result["jobs"])
        assert (back.opcode, back.status) == ("vm.migrate", "success") and back.result["migration"]["downtime_ms"] > 0
        vm = VM.objects.get(pk=vm.pk)
        assert (vm.state, vm.host_id) == ("running", source.pk)
        assert Hypervisor.objects.get(pk=target.pk).state == "drained"
        assert ssh_output(session, f"cat /proc/{pid}/comm; cat /proc/sys/kernel/random/boot_id").split() == [
            "sleep",
            boot.strip(),
        ]
        print(f"evacuated, live: {back.result['migration']}")
    finally:
        session.close()

    drained(sync_jobs, services.submit_action(vm, "destroy", actor=admin_user))
    assert (here.state(vm.key), there.state(vm.key)) == (VMState.ABSENT, VMState.ABSENT)


def test_a_move_whose_target_dies_leaves_the_guest_running_then_it_moves_with_its_disk_copied(
    two_hosts,
    admin_user,
    sync_jobs,  # noqa: F811
    guest,
):
    host_a, host_b = two_kvm_hosts(two_hosts, shared=False)
    vm, job = services.request_vm(actor=admin_user, owner=admin_user, image=guest)
    drained(sync_jobs, job)
    vm = VM.objects.get(pk=vm.pk)
    source, target = (host_a, host_b) if vm.host_id == host_a.pk else (host_b, host_a)
    dying = two_hosts.a if target == host_a else two_hosts.b
    here, there = drivers.driver_for(source), drivers.driver_for(target)
    boot = guest_run(here, vm.key, "boot", "cat /proc/sys/kernel/random/boot_id")
    # What the guest wrote on its disk (past the base image's 64 MiB: only the overlay holds it)
    guest_run(here, vm.key, "mark", f"printf moved-with-it | dd of=/dev/vda bs=512 seek={MARK_AT} conv=notrunc; sync")
    pid = guest_run(here, vm.key, "sleeper", "sleep 10000 </dev/null >/dev/null 2>&1 & echo $!").strip()
    claim = vm.allocation

    # The target's libvirtd killed while the memory goes over (slowed down to last ~10 s)
    dom = here.conn.lookupByName(vm.key)
    unlimited = dom.migrateGetMaxSpeed(0)
    dom.migrateSetMaxSpeed(SLOW_MIB_S, 0)
    killer = threading.Thread(target=kill_once_incoming, args=(two_hosts, dying, vm.key), daemon=True)
    killer.start()
    failed = services.submit_action(vm, "migrate", actor=admin_user, target=target.pk)
    sync_jobs.drain(budget=AGENT_SECONDS)
    killer.join(timeout=AGENT_SECONDS)
    failed = Job.objects.get(pk=failed.pk)
    assert failed.status == "error" and target.name in failed.error_message, failed.error_message
    vm = VM.objects.get(pk=vm.pk)
    assert (vm.state, vm.host_id, vm.target_allocation_id) == ("running", source.pk, None)
    assert f"{target.name} did not answer afterwards" in vm.error, vm.error
    assert vm.allocation_id == claim.pk and Allocation.objects.get(pk=claim.pk).released is None
    target_claims = Allocation.objects.filter(host=target)
    assert [a.released is not None for a in target_claims] == [True], "the target's claim went back"
    assert here.state(vm.key) == VMState.RUNNING
    assert guest_run(here, vm.key, "boot-kept", "cat /proc/sys/kernel/random/boot_id") == boot
    assert guest_run(here, vm.key, "sleeper-kept", f"cat /proc/{pid}/comm").strip() == "sleep"
    took = (failed.ended - failed.started).total_seconds()
    print(f"\na migration whose target died ({took:.1f} s): {failed.error_message}")

    dom.migrateSetMaxSpeed(unlimited, 0)
    two_hosts.restart(dying)
    job = drained(sync_jobs, services.submit_action(vm, "migrate", actor=admin_user, target=target.pk))

    vm = VM.objects.get(pk=vm.pk)
    assert (vm.state, vm.host_id) == ("running", target.pk)
    assert (here.state(vm.key), there.state(vm.key)) == (VMState.ABSENT, VMState.RUNNING)
    assert guest_run(there, vm.key, "boot-after", "cat /proc/sys/kernel/random/boot_id") == boot
    assert guest_run(there, vm.key, "sleeper-after", f"cat /proc/{pid}/comm").strip() == "sleep"
    read = f"echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/vda bs=512 skip={MARK_AT} count=1 2>/dev/null | head -c 13"
    assert guest_run(there, vm.key, "mark-after", read) == "moved-with-it"
    assert [v.name() for v in here._pool().listAllVolumes() if v.name().startswith(vm.key)] == []  # disk, seed: gone
    migration = job.result["migration"]
    assert 0 < migration["downtime_ms"] < migration["total_ms"] and migration["memory_bytes"] > 0, migration
    print(f"live migration, disk copied: {migration}")

    # Stopped, it goes back offline: its disk as it is now goes with it
    drained(sync_jobs, services.submit_action(vm, "stop", actor=admin_user))
    job = drained(
        sync_jobs, services.submit_action(VM.objects.get(pk=vm.pk), "migrate", actor=admin_user, target=source.pk)
    )
    vm = VM.objects.get(pk=vm.pk)
    assert (vm.state, vm.host_id) == ("stopped", source.pk) and "migration" not in job.result
    assert (here.state(vm.key), there.state(vm.key)) == (VMState.STOPPED, VMState.ABSENT)
    drained(sync_jobs, services.submit_action(vm, "start", actor=admin_user))
    assert guest_run(here, vm.key, "mark-back", read) == "moved-with-it"

    drained(sync_jobs, services.submit_action(VM.objects.get(pk=vm.pk), "destroy", actor=admin_user))
    assert here.state(vm.key) == VMState.ABSENT


def kill_once_incoming(two_hosts, host, key, timeout=AGENT_SECONDS):
    """Kill ``host``'s libvirtd a second after the incoming domain ``key`` appears there."""
    conn = libvirt.open(host.uri)
    try:
        deadline = time.monotonic() + timeout
        while key not in [dom.name() for dom in conn.listAllDomains()]:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
    finally:
        conn.close()
    time.sleep(1)
    two_hosts.kill_libvirtd(host)
