"""Faults on a real hypervisor: the private libvirtd and real QEMU guests of the
test image, vclmgr's own libvirt driver and ``vm.create`` run in this process (``sync_jobs``).

- QEMU killed (by its PID) while the guest boots: the create notices at once that the VM
  stopped, cleans the first host, retries on the second and the guest lets its owner in there.
- The seed volume gone before the start: the start fails on each host, the retry included, and
  the VM ends ``failed`` naming the seed file.
- A guest whose init never starts its SSH server (the image's own cloud-config removes
  dropbear in ``bootcmd``): ``failed`` with "did not answer on port 22 within … s".
- The same guest with readiness by guest agent: ``running``, as its agent answers.

After each: no domain, no volume of the VM in any pool, no live claim (libvirt API and the
Allocation table), also when the test fails (the fixture removes what is left).
"""

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from capacity.models import Allocation
from capacity.snapshot import snapshot
from drivers.libvirt.connection import connections
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import VM
from provisioning.opcodes import guest as guest_ops
from provisioning.opcodes import lifecycle
from tests import realvm
from tests.integration.test_reserve_real_vm import vm_ids  # noqa: F401 (a fixture)
from tests.jobs.conftest import SyncJobs
from tests.jobs.helpers import wait_until
from tests.localkvm_inventory import kvm_guest_image, kvm_host
from tests.realvm import new_login, ssh_run

pytestmark = pytest.mark.slow
BUDGET = 600  # s for one job in this process: a boot is ~10 s alone, much more on a shared machine
NO_SSH = "#cloud-config\nbootcmd:\n  - rm -f /usr/sbin/dropbear\n"


@pytest.fixture
def sync_jobs(monkeypatch):
    return SyncJobs(monkeypatch)


@pytest.fixture
def kvm_hosts(libvirtd, libvirt_conn, guest_image, vm_ids):  # noqa: F811
    """``kvm_hosts(n)``: n inventory hosts on the one private libvirtd, each with its own empty
    pool (a VM's disk and seed on one host are invisible to the other; a domain is the host's
    whose pool holds its disk)."""

    made = []

    def make(n):
        for i in range(n):
            pool = realvm.Pool(libvirt_conn, guest_image, name=f"{realvm.PREFIX}vcl-{os.getpid()}-{i}", stage=False)
            host = kvm_host(libvirtd.uri, pool.name, f"kvm-{i}")
            made.append((host, pool))
        snapshot.reset()  # this process places: it must see the hosts just made
        return made

    yield make
    realvm.remove_domains_on(libvirt_conn, [pool.path for _, pool in made])
    for _, pool in made:
        pool.close()
    connections.forget(libvirtd.uri)
    snapshot.reset()


def image(guest_image, name, **fields):
    return kvm_guest_image(guest_image, name, **fields)


def create(owner, img, sync_jobs, key=""):
    vm, job = vms.request_vm(actor=owner, owner=owner, image=img, ssh_key=key)
    sync_jobs.drain(budget=BUDGET)
    return VM.objects.get(pk=vm.pk), Job.objects.get(pk=job.pk)


def destroy(vm, sync_jobs):
    vms.submit_action(vm, "destroy", actor="test")
    sync_jobs.drain(budget=BUDGET)
    assert VM.objects.get(pk=vm.pk).state == "destroyed"


def assert_nothing_left(conn, hosts, key):
    assert key not in [d.name() for d in conn.listAllDomains()]
    for _, pool in hosts:
        assert [v for v in pool.volumes() if v.startswith(key)] == [], pool.name
    assert not Allocation.objects.filter(released__isnull=True).exists()


def qemu_pid(name):
    """The PID of the QEMU process running domain ``name`` (libvirt's pid file, checked against
    the process it names), or None."""
    pid = realvm._read_pid(f"/run/libvirt/qemu/{name}.pid")
    if pid is None or not (realvm._exe_name(pid) or "").startswith("qemu-system"):
        return None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return pid if f"guest={name}".encode() in b",".join(cmdline) else None


class KillOnBoot(threading.Thread):
    """Kills the QEMU process of domain ``key`` (SIGKILL, by its PID) once, a second after its
    CPUs run (libvirt's start has returned; the guest is in its firmware or kernel)."""

    def __init__(self, uri, key):
        super().__init__(daemon=True)
        self.uri, self.key, self.done, self.killed, self.pool = uri, key, threading.Event(), None, None

    def run(self):
        import libvirt

        conn = libvirt.open(self.uri)
        try:
            while not self.done.is_set():
                with contextlib.suppress(libvirt.libvirtError):
                    dom = conn.lookupByName(self.key)
                    running = dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
                    pid = qemu_pid(self.key) if running else None
                    if pid is not None:
                        time.sleep(1)
                        self.pool = next(p for p in dom.XMLDesc(0).split("'") if p.endswith(f"/{self.key}.qcow2"))
                        os.kill(pid, signal.SIGKILL)
                        self.killed = pid
                        return
                time.sleep(0.05)
        finally:
            conn.close()


def test_qemu_killed_during_boot_is_retried_on_the_other_host_and_lets_the_owner_in(
    libvirtd, libvirt_conn, guest_image, kvm_hosts, alice, sync_jobs
):
    hosts = kvm_hosts(2)
    img = image(guest_image, "guest-debian")
    login = new_login()
    vm, job = vms.request_vm(actor=alice, owner=alice, image=img, ssh_key=login["public"])
    killer = KillOnBoot(libvirtd.uri, vm.key)
    killer.start()
    try:
        sync_jobs.drain(budget=BUDGET)
    finally:
        killer.done.set()
        killer.join(10)
    vm, job = VM.objects.get(pk=vm.pk), Job.objects.get(pk=job.pk)
    assert killer.killed, "the QEMU process was never seen running"
    assert job.status == "success", job.error_message
    first = next(h for h, p in hosts if str(p.path) in killer.pool)
    assert vm.state == "running" and vm.host != first
    notes = " ".join(entry[1] for entry in job.reason)
    assert f"failed on {first.name} ({vm.key} stopped while booting" in notes, notes
    # the first host is clean and its claim released; the second holds the only live claim
    assert [v for v in dict(hosts)[first].volumes() if v.startswith(vm.key)] == []
    live = Allocation.objects.filter(released__isnull=True)
    assert [a.host_id for a in live] == [vm.host_id] and first.pk in Allocation.objects.values_list("host", flat=True)
    out = ssh_run(vm.port, "alice", "id -un; hostname", host=vm.address, pkey=login["pkey"])
    assert out.split() == ["alice", vm.key]
    destroy(vm, sync_jobs)
    assert_nothing_left(libvirt_conn, hosts, vm.key)


def test_a_seed_gone_before_the_start_fails_on_each_host_naming_the_seed(
    libvirt_conn, guest_image, kvm_hosts, alice, sync_jobs, monkeypatch
):
    hosts = kvm_hosts(2)
    img = image(guest_image, "guest-debian")
    real_boot, deleted = lifecycle.booted, []

    def boot_without_seed(vm_id, *, actor, **fields):
        key = VM.objects.get(pk=vm_id).key
        for _, pool in hosts:
            pool.pool.refresh(0)
            for vol in pool.pool.listAllVolumes():
                if vol.name() == f"{key}-seed.iso":
                    vol.delete(0)
                    deleted.append(pool.name)
        return real_boot(vm_id, actor=actor, **fields)

    monkeypatch.setattr(lifecycle, "booted", boot_without_seed)
    vm, job = create(alice, img, sync_jobs, key=new_login()["public"])
    assert sorted(deleted) == sorted(pool.name for _, pool in hosts)  # the retry ran on the other host
    assert job.status == "error" and vm.state == "failed"
    assert f"{vm.key}-seed.iso" in vm.error and "start" in vm.error, vm.error
    assert [s["name"] for s in job.steps].count("retry") == 1
    assert_nothing_left(libvirt_conn, hosts, vm.key)


def test_a_guest_that_never_starts_ssh_fails_naming_the_port_and_leaves_nothing(
    libvirt_conn, guest_image, kvm_hosts, alice, sync_jobs
):
    hosts = kvm_hosts(1)
    img = image(guest_image, "no-ssh", user_data=NO_SSH, ready_timeout=25)
    started = time.monotonic()
    vm, job = create(alice, img, sync_jobs, key=new_login()["public"])
    assert job.status == "error" and vm.state == "failed"
    assert "guest did not answer on port 22 within 25 s" in vm.error, vm.error
    assert "no other host to retry on" in vm.error
    assert time.monotonic() - started >= 25
    assert_nothing_left(libvirt_conn, hosts, vm.key)


def test_readiness_by_guest_agent_makes_a_guest_without_ssh_ready(
    libvirt_conn, guest_image, kvm_hosts, alice, sync_jobs
):
    import json

    import libvirt_qemu

    hosts = kvm_hosts(1)
    img = image(guest_image, "no-ssh-agent", user_data=NO_SSH, ready_timeout=240, readiness="agent")
    vm, job = create(alice, img, sync_jobs, key=new_login()["public"])
    assert job.status == "success", job.error_message
    assert vm.state == "running"
    dom = libvirt_conn.lookupByName(vm.key)

    def host_name():  # the guest starts its agent first, then applies the seed: a moment later on a busy host
        answer = json.loads(libvirt_qemu.qemuAgentCommand(dom, '{"execute":"guest-get-host-name"}', 10, 0))
        return answer["return"]["host-name"] == vm.key

    wait_until(host_name, timeout=30, what="the seed's host name", interval=0.5)  # our seed reached this VM's agent
    assert not guest_ops.answers(vm.address, vm.port, "ssh")  # ready without any SSH server
    destroy(vm, sync_jobs)
    assert_nothing_left(libvirt_conn, hosts, vm.key)
