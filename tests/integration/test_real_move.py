"""A suspended VM moved to another host with its memory, on real QEMU: vclmgr's own
libvirt driver, two hosts as two pools of the private libvirtd (a domain is the host's whose
pool holds its disk). One guest (booting its kernel directly) runs a command that keeps a value
in its shell while it waits for a file; it is suspended (managed save) on host A and moved to
host B, where it resumes, the test writes the file, and the same command (the same boot) prints
the value; its snapshot went along. Before that, moves that fail: B's pool missing (refused
before anything changes), B refusing the restore (undone: A holds the VM suspended as before,
no saved-memory volume left anywhere), and a worker that dies after the copies and again after
the restore on B (the retried call goes on from there). At the end the VM is destroyed on B: no
domain, no volume of it in either pool.
"""

import os
import time

import libvirt
import pytest

from drivers import cloudinit
from drivers.base import DriverError, ImageVariantSpec, NotFound, VMSpec, VMState
from drivers.libvirt import domxml, qcow2
from drivers.libvirt.connection import connections
from drivers.libvirt.driver import LibvirtDriver
from tests import realvm

pytestmark = pytest.mark.slow
AGENT_SECONDS = 240  # a boot under software emulation on two shared cores
# The command waits for GATE, written once the guest runs on B (not a fixed sleep that has to
# outlast the failed moves before it).
GATE = "/tmp/vclmgr-test-go"
COMMAND = f"cat /proc/sys/kernel/random/boot_id; n=6; while [ ! -e {GATE} ]; do sleep 1; done; echo $((n * 7))"


class Crash(BaseException):
    """A worker dying mid-call: nothing of the driver catches it, nothing is undone."""


@pytest.fixture
def hosts(libvirtd, libvirt_conn, guest_image):
    """Two hosts (drivers) on the private libvirtd, each with an empty pool of its own."""
    made = []
    for name in ("a", "b"):
        pool = realvm.Pool(libvirt_conn, guest_image, name=f"{realvm.PREFIX}mv-{os.getpid()}-{name}", stage=False)
        options = {"domain_type": "qemu", "pool": pool.name, "network": "user", "name": f"kvm-{name}"}
        made.append((LibvirtDriver(libvirtd.uri, options=options), pool))
    yield made
    realvm.remove_domains_on(libvirt_conn, [pool.path for _, pool in made])
    for _, pool in made:
        pool.close()
    connections.forget(libvirtd.uri)


def volumes(pool, key):
    return [name for name in pool.volumes() if name.startswith(key)]


def wait_agent(driver, key):
    deadline = time.monotonic() + AGENT_SECONDS
    while not driver.agent_answers(key):
        assert time.monotonic() < deadline, f"no guest agent on {key}"
        time.sleep(0.3)


def output_until(driver, key, tag, done):
    deadline = time.monotonic() + AGENT_SECONDS
    while True:
        status = driver.guest_exec_status(key, tag, 0)
        if done(status):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.3)


def refused(message):
    def error():
        libvirt.virResetLastError()  # (a libvirtError takes the thread's last error as its message)
        return libvirt.libvirtError(message)

    return error


def fail_on(monkeypatch, cls, name, pool, error):
    """``cls.name`` raises ``error()`` when called for something in ``pool``; else the real call."""
    real = getattr(cls, name)

    def call(self, *args):
        about = args[0] if isinstance(self, libvirt.virConnect) else self.XMLDesc(0)
        if str(pool.path) in str(about):
            raise error()
        return real(self, *args)

    monkeypatch.setattr(cls, name, call)


def intact_on_a(a, pool_a, pool_b, key, conn):
    assert a.state(key) == VMState.SUSPENDED
    assert conn.lookupByName(key).hasManagedSaveImage(0)
    assert volumes(pool_a, key) == [f"{key}-seed.iso", f"{key}.qcow2"]  # no saved-memory volume
    assert volumes(pool_b, key) == []


def test_a_suspended_vm_moves_to_another_host_with_its_memory_and_failed_moves_leave_it_intact(
    hosts, libvirt_conn, guest_image, monkeypatch
):
    (a, pool_a), (b, pool_b) = hosts
    key = f"vcl-mv{os.getpid()}"
    files = guest_image["dir"]
    image = ImageVariantSpec(  # booting its kernel: the move names B's copies of kernel and initrd
        "guest-debian",
        "qcow2",
        str(files / "disk.qcow2"),
        kernel=str(files / "vmlinux"),
        initrd=str(files / "initrd"),
        kernel_args=guest_image["cmdline"],
    )
    a.stage_image(image)
    b.stage_image(image)
    login = cloudinit.GuestLogin(
        instance_id=f"i-{key}", hostname=key, login="alice", password_hash=cloudinit.password_hash("pw-12345678")
    )
    a.create(VMSpec(key, 1, 256, 1, image, extra={"guest_port": 22}, guest=login))
    a.snapshot(key, "clean")  # before its first boot (as a pooled image's VM has it): it moves too
    a.start(key)
    wait_agent(a, key)
    a.guest_exec(key, "moved", ["/bin/sh", "-c", COMMAND])
    boot = output_until(a, key, "moved", lambda s: s.output.count(b"\n") >= 1).output.decode().split()[0]
    a.suspend(key)
    intact_on_a(a, pool_a, pool_b, key, libvirt_conn)

    nowhere = LibvirtDriver(a.uri, options={**b.options, "pool": f"{realvm.PREFIX}absent"})
    with pytest.raises(NotFound, match="absent"):
        a.migrate(key, nowhere)
    intact_on_a(a, pool_a, pool_b, key, libvirt_conn)

    with monkeypatch.context() as patched:
        fail_on(patched, libvirt.virConnect, "restoreFlags", pool_b, refused("the target refuses the restore"))
        with pytest.raises(DriverError, match="refuses the restore"):
            a.migrate(key, b)
    intact_on_a(a, pool_a, pool_b, key, libvirt_conn)

    with monkeypatch.context() as patched:  # dies once the copies are on B
        fail_on(patched, libvirt.virConnect, "restoreFlags", pool_b, Crash)
        with pytest.raises(Crash):
            a.migrate(key, b)
    assert a.state(key) == VMState.STOPPED and f"{key}.save" in volumes(pool_a, key)  # its memory in the volume
    with monkeypatch.context() as patched:  # the retry dies once B has restored it, before B's managed save
        fail_on(patched, libvirt.virDomain, "managedSave", pool_b, Crash)
        with pytest.raises(Crash):
            a.migrate(key, b)
    assert b.state(key) == VMState.SUSPENDED and libvirt_conn.lookupByName(key).isActive()  # paused on B
    a.migrate(key, b)
    a.migrate(key, b)  # moved already: nothing to do

    assert (a.state(key), b.state(key)) == (VMState.ABSENT, VMState.SUSPENDED)
    moved = libvirt_conn.lookupByName(key)
    assert moved.hasManagedSaveImage(0) and moved.snapshotListNames(0) == ["clean"]
    assert str(pool_b.path) in moved.snapshotLookupByName("clean").getXMLDesc(0)
    booted = domxml.kernel_boot(moved.XMLDesc(0))
    assert booted["kernel"].startswith(f"{pool_b.path}/") and booted["initrd"].startswith(f"{pool_b.path}/")
    assert domxml.kernel_boot(moved.snapshotLookupByName("clean").getXMLDesc(0))["kernel"] == booted["kernel"]
    assert volumes(pool_a, key) == [] and volumes(pool_b, key) == [f"{key}-seed.iso", f"{key}.qcow2"]
    with open(pool_b.path / f"{key}.qcow2", "rb") as disk:  # its disk is B's overlay of B's own base
        assert qcow2.backing_file(disk.read(1 << 16)) == str(pool_b.path / os.path.basename(a.stage_image(image)))
    b.resume(key)
    wait_agent(b, key)
    b.guest_exec(key, "gate", ["/bin/sh", "-c", f": > {GATE}"])
    status = output_until(b, key, "moved", lambda s: s.exited)
    assert (status.exit_status, status.output.decode().split()) == (0, [boot, "42"])  # the same boot, the same shell

    b.stop(key, force=True)
    b.revert(key, "clean")  # B's snapshot of B's disk
    assert b.state(key) == VMState.STOPPED
    b.destroy(key)
    assert key not in [d.name() for d in libvirt_conn.listAllDomains()]
    assert volumes(pool_a, key) == [] and volumes(pool_b, key) == []
