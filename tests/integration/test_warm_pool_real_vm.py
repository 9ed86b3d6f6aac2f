"""A warm pool on real QEMU: the test guest booted once with no login, snapshotted running;
a reservation takes it and its user logs in over SSH with the login handed over through the
guest agent (by key). After it ends the VM is reverted to its warm snapshot and back in the
pool; the next user takes it (by the one-time password) and gets another SSH host key and
machine-id, nothing the first user wrote, and the first user's key is refused. One boot for
the pool, and one for a reservation built cold before the pool had a warm VM (the time to
compare). The jobs run in this process (no queue wait in the times); the VMs on the private
libvirtd."""

import time
from datetime import timedelta

import paramiko
import pytest

from jobs.models import Job
from provisioning import services as vms
from provisioning import warm
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


def test_two_users_of_a_warm_pool_get_their_own_login_and_identity(
    kvm_host, guest_image, alice, bob, admin_user, sync_jobs
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
    print(
        f"\nreserve→ready cold: {cold_ready:.2f} s; warm VM built (boot, answer, snapshot): {first_fill:.1f} s; "
        f"reserve→ready warm: {warm_ready:.2f} s, then {second_ready:.2f} s after its revert to the warm "
        f"snapshot ({rewarmed:.2f} s)"
    )
