"""A warm pool on real QEMU: the test guest booted once with no login, snapshotted running;
a reservation takes it and its user logs in over SSH with the login handed over through the
guest agent (by key). After it ends the VM is reverted to its warm snapshot and back in the
pool; the next user takes it (by the one-time password) and gets another SSH host key and
machine-id, nothing the first user wrote, and the first user's key is refused. Then the
pooled VM's guest agent hangs (stopped by a signal, as a wedged agent is): the next reservation
that takes it falls back to the cold build, its user logs in all the same, and the hung guest is
gone (its QEMU process, its warm snapshot; after the reservation, its domain and volumes). One
boot for the pool, one for a reservation built cold before the pool had a warm VM (the time to
compare), one for the fallback. The jobs run in this process (no queue wait in the times); the
VMs on the private libvirtd."""

import json
import time
from datetime import timedelta

import libvirt
import libvirt_qemu
import paramiko
import pytest

from jobs.models import Job
from provisioning import services as vms
from provisioning import warm
from provisioning.opcodes import warm as warm_opcodes
from reservations import services
from reservations.models import Reservation
from tests.integration import test_reserve_real_vm as reserve_real
from tests.jobs import conftest as jobs_fixtures
from tests.localkvm_inventory import kvm_guest_image
from tests.realvm import new_login, ssh_client

pytestmark = pytest.mark.slow
kvm_host, vm_ids = reserve_real.kvm_host, reserve_real.vm_ids  # the reservation tests' host and VM ids
sync_jobs = jobs_fixtures.sync_jobs  # jobs run in this process
H = timedelta(hours=1)
PROBE = "id -un; hostname; cat /etc/machine-id; ls /tmp"


def fill(image, sync_jobs):
    started = time.monotonic()
    assert warm.fill(image) == {"requested": 1}
    sync_jobs.drain()
    [vm] = warm.warm_vms(image)
    assert vm.state == "running" and vms.has_warm_snapshot(vm), vm.error
    return time.monotonic() - started


def reserve(user, image, sync_jobs, key="", how="warm from the pool"):
    started = time.monotonic()
    reservation = services.reserve(user, image, actor=user, duration=H, ssh_key=key)
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    assert reservation.status == "ready", reservation.error
    build = Job.objects.filter(opcode="vm.create", params__vm=reservation.vm_id).latest("pk")
    log = [entry.message for entry in build.log_entries.all()]
    assert reservation.history.last().reason.endswith(how), log
    return reservation, time.monotonic() - started


def session(reservation, command, **auth):
    """``(output, host key fingerprint)`` of ``command`` run by the reservation's user (``auth``:
    their key, else the reservation's one-time password)."""
    details = services.connection(reservation)
    auth = auth or {"password": details["password"]}
    client = ssh_client(details["port"], details["user"], details["address"], **auth)
    try:
        host_key = client.get_transport().get_remote_server_key().get_fingerprint().hex()
        _, stdout, stderr = client.exec_command(command, timeout=60)
        out = stdout.read().decode().split()
        assert stdout.channel.recv_exit_status() == 0, (out, stderr.read().decode())
        return out, host_key
    finally:
        client.close()


def qemu_pids():
    """{domain name: QEMU pid} of the domains running on this machine (from /proc)."""
    from pathlib import Path

    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            names = [a for a in args if a.startswith(b"guest=")]
            if names and b"qemu-system" in args[0]:
                found[names[0].split(b",")[0][len(b"guest=") :].decode()] = int(entry.name)
    return found


def hang_agent(dom):
    """The guest's agent stopped by SIGSTOP, sent by a command the agent itself starts: its
    channel stays open and nothing answers (a wedged agent)."""
    stop = {"path": "/bin/sh", "arg": ["-c", "sleep 0.2; kill -STOP $(cat /run/qemu-ga.pid)"]}
    libvirt_qemu.qemuAgentCommand(dom, json.dumps({"execute": "guest-exec", "arguments": stop}), 10, 0)
    time.sleep(1)
    with pytest.raises(libvirt.libvirtError):
        libvirt_qemu.qemuAgentCommand(dom, '{"execute":"guest-ping"}', 2, 0)


def test_two_users_of_a_warm_pool_get_their_own_login_and_identity(
    kvm_host, guest_image, alice, bob, admin_user, sync_jobs, libvirt_conn, monkeypatch
):
    image = kvm_guest_image(guest_image, "guest-warm", warm_min=1, warm_max=1)
    cold, cold_ready = reserve(admin_user, image, sync_jobs, how="built cold")  # none warm yet: a boot
    services.end(cold, actor=admin_user)
    sync_jobs.drain()
    first_fill = fill(image, sync_jobs)

    login = new_login()  # the first user by SSH key
    first, warm_ready = reserve(alice, image, sync_jobs, key=login["public"])
    out, first_key = session(first, f"echo mine > /tmp/mark-{login['login']}; {PROBE}", pkey=login["pkey"])
    assert out[:2] == ["alice", first.vm.key]
    first_id = out[2]
    assert f"mark-{login['login']}" in out[3:]
    started = time.monotonic()
    services.end(first, actor=alice)
    sync_jobs.drain()
    rewarmed = time.monotonic() - started
    vm = Reservation.objects.get(pk=first.pk).vm
    assert vm.warm == "warm" and vm.state == "running" and vm.owner is None  # reverted, back in the pool

    second, second_ready = reserve(bob, image, sync_jobs)  # by the one-time password (its hash set by the agent)
    out, second_key = session(second, PROBE)
    assert out[:2] == ["bob", second.vm.key] and second.vm_id == first.vm_id
    assert second_key != first_key and out[2] != first_id
    assert f"mark-{login['login']}" not in out[3:]
    details = services.connection(second)
    with pytest.raises(paramiko.AuthenticationException):  # the first user's key opens nothing here
        ssh_client(details["port"], "alice", details["address"], pkey=login["pkey"]).close()
    with pytest.raises(paramiko.AuthenticationException):
        ssh_client(details["port"], "bob", details["address"], pkey=login["pkey"]).close()
    services.end(second, actor=bob)
    sync_jobs.drain()
    hung = Reservation.objects.get(pk=second.pk).vm
    assert hung.warm == "warm" and hung.state == "running"  # back in the pool again

    # Its agent hangs: the next reservation is built cold on the same claim, and works.
    _host, pool = kvm_host
    hang_agent(libvirt_conn.lookupByName(hung.key))
    old_qemu = qemu_pids()[hung.key]
    monkeypatch.setattr(warm_opcodes, "AGENT_SECONDS", 3)  # (15 s in production: the fallback is the same)
    login = new_login()
    third, fallback_ready = reserve(admin_user, image, sync_jobs, key=login["public"], how="built cold")
    assert third.vm_id == hung.pk and third.vm.warm == "miss"
    build = Job.objects.filter(opcode="vm.create", params__vm=hung.pk).latest("pk")
    assert [step["name"] for step in build.steps][:2] == ["cold", "claim"]  # warm-resume failed: no step
    log = " ".join(entry.message for entry in build.log_entries.all())
    assert f"the guest agent of {hung.key} did not answer within 3 s" in log, log
    out, _ = session(third, PROBE, pkey=login["pkey"])
    assert out[:2] == ["admin", hung.key]
    assert qemu_pids()[hung.key] != old_qemu and old_qemu not in qemu_pids().values()  # the hung guest is gone
    assert libvirt_conn.lookupByName(hung.key).snapshotListNames(0) == []  # and its warm snapshot with it
    assert warm.warm_vms(image).count() == 0  # the pool's next round builds a new one
    services.end(third, actor=admin_user)
    sync_jobs.drain()
    assert hung.key not in [dom.name() for dom in libvirt_conn.listAllDomains()]
    assert [name for name in pool.volumes() if name.startswith(hung.key)] == []
    print(
        f"\nreserve→ready cold: {cold_ready:.2f} s; warm VM built (boot, answer, snapshot): {first_fill:.1f} s; "
        f"reserve→ready warm: {warm_ready:.2f} s, then {second_ready:.2f} s after its revert to the warm "
        f"snapshot ({rewarmed:.2f} s); a hung agent's fallback to cold: {fallback_ready:.2f} s"
    )
