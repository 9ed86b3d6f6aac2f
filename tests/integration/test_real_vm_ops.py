"""vclmgr's VM operations on real QEMU VMs of the private libvirtd, proven from inside the guest.

- ``revert_on_end``: the clean snapshot is the VM as defined, before its first boot; ending
  the reservation reverts the disk to it and removes the user's seed; the next user gets the
  same VM with a fresh seed: their one-time password works, the last user's does not, and
  what the last user wrote on the disk is gone.
- One VM through extend, suspend/resume (managed save), snapshot/revert (internal qcow2
  snapshots of the overlay, with memory), capture into a derived image (which then boots and
  holds the captured disk), and end: domain, overlay and seed gone, claims released.

The test guest keeps its root filesystem in RAM (tools/guest-image), so what must outlive a
reboot is written raw to its disk (its users may write /dev/vda) beyond the base image's
64 MiB, where only the overlay holds it.
"""

from datetime import timedelta

import libvirt
import paramiko
import pytest
from django.utils import timezone

from capacity.models import Allocation
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import VM, Image
from reservations.models import Reservation
from tests import realvm
from tests.integration import test_reserve_real_vm as reserving
from tests.integration.test_reserve_real_vm import URL, end_and_check_gone, reserve, wait_ready
from tests.jobs.helpers import wait_until
from tests.realvm import new_login, ssh_run

pytestmark = pytest.mark.slow
JOB_TIMEOUT = 240  # s: a boot or a managed save under software emulation on shared cores
MARK_AT = 200_000  # 512-byte sector: ~100 MiB into the disk, past the 64 MiB base image
# The real-VM fixtures of the reservation tests: a host on the private libvirtd, the guest image.
kvm_host, guest, vm_ids = reserving.kvm_host, reserving.guest, reserving.vm_ids
READ_MARK = f"dd if=/dev/vda bs=512 skip={MARK_AT} count=1 2>/dev/null | head -c 32"


def write_mark(details, text, **auth):
    ssh_run(
        details["port"],
        details["user"],
        f"printf '%-32s' {text} | dd of=/dev/vda bs=512 seek={MARK_AT} conv=notrunc,sync 2>/dev/null; sync",
        host=details["address"],
        **auth,
    )


def read_mark(details, **auth):
    return ssh_run(details["port"], details["user"], READ_MARK, host=details["address"], **auth).strip("\0 \n")


@pytest.fixture
def leave_nothing(kvm_host, libvirt_conn):
    """Whatever a failed test left in its pool goes, snapshots and saved memory included
    (kvm_host's own cleanup cannot undefine a domain that has snapshots)."""
    yield
    _host, pool = kvm_host
    realvm.remove_domains_on(libvirt_conn, [pool.path])


def run_job(job_id, worker):
    def finished():
        job = Job.objects.get(pk=job_id)
        return job if job.status in Job.FINAL else None

    job = wait_until(finished, JOB_TIMEOUT, f"job {job_id}", worker, interval=0.2)
    assert job.status == "success", f"{job.opcode}: {job.error_message}\n{worker.output()[-3000:]}"
    return job


def act(client, vm_id, verb, worker, **body):
    response = client.post(f"/api/v1/vms/{vm_id}/{verb}/", body, format="json")
    assert response.status_code == 202, response.content
    return run_job(response.json()["job"], worker)


def refused(details, login, password):
    try:
        ssh_run(details["port"], login, "true", host=details["address"], password=password)
    except paramiko.AuthenticationException:
        return True
    return False


def domain_of(conn, key):
    return conn.lookupByName(key)


def test_revert_on_end_hands_the_next_user_a_clean_vm_with_a_fresh_seed(
    worker, api, alice, bob, kvm_host, guest, libvirt_conn, leave_nothing
):
    _host, pool = kvm_host
    vms.update_image(guest, actor="test", revert_on_end=True)
    client = api(alice)
    first = reserve(client, guest)
    details = wait_ready(client, first, worker)["connection"]
    old_password = details["password"]
    vm = Reservation.objects.get(pk=first).vm
    dom = domain_of(libvirt_conn, vm.key)
    clean = dom.snapshotLookupByName("clean", 0)
    assert "<state>shutoff</state>" in clean.getXMLDesc(0)  # taken before the first boot: nobody's login in it
    write_mark(details, "alice-was-here", password=old_password)
    assert read_mark(details, password=old_password) == "alice-was-here"
    assert client.post(f"{URL}{first}/end/").status_code == 202
    wait_until(lambda: Reservation.objects.get(pk=first).status == "ended", JOB_TIMEOUT, "the end", worker)

    parked = VM.objects.get(pk=vm.pk)
    assert dom.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF and parked.state == "stopped" and parked.owner is None
    assert f"{vm.key}-seed.iso" not in pool.volumes()  # the last user's password hash left the host
    assert "-seed.iso" not in dom.XMLDesc(0)  # an empty CD-ROM tray
    assert Allocation.objects.get(pk=Reservation.objects.get(pk=first).allocation_id).released is not None

    next_client = api(bob)
    second = reserve(next_client, guest)
    fresh = wait_ready(next_client, second, worker)["connection"]
    assert Reservation.objects.get(pk=second).vm_id == vm.pk  # the same VM, reused
    assert fresh["password"] != old_password and fresh["user"] == "bob"
    assert ssh_run(fresh["port"], "bob", "id -un", host=fresh["address"], password=fresh["password"]).split() == ["bob"]
    assert read_mark(fresh, password=fresh["password"]) == ""  # reverted: what alice wrote is gone
    assert refused(fresh, "alice", old_password) and refused(fresh, "bob", old_password)

    assert next_client.post(f"{URL}{second}/end/").status_code == 202
    wait_until(lambda: Reservation.objects.get(pk=second).status == "ended", JOB_TIMEOUT, "the end", worker)
    run_job(vms.submit_action(VM.objects.get(pk=vm.pk), "destroy", actor="test").pk, worker)
    assert vm.key not in [d.name() for d in libvirt_conn.listAllDomains()]
    assert [v for v in pool.volumes() if v.startswith(vm.key)] == []


def test_one_vm_through_extend_suspend_snapshot_capture_and_end(
    worker, api, alice, kvm_host, guest, libvirt_conn, leave_nothing
):
    _host, pool = kvm_host
    client = api(alice)
    user = new_login()
    key = {"pkey": user["pkey"]}
    rid = reserve(client, guest, ssh_key=user["public"])
    details = wait_ready(client, rid, worker)["connection"]
    reservation = Reservation.objects.get(pk=rid)
    vm = reservation.vm

    # extend: the claim follows
    new_end = reservation.end + timedelta(minutes=30)
    response = client.post(f"{URL}{rid}/extend/", {"end": new_end.isoformat()}, format="json")
    assert response.status_code == 200, response.content
    reservation.refresh_from_db()
    assert reservation.allocation.end == new_end and reservation.allocation.released is None

    # suspend (managed save: memory to disk, QEMU gone) and resume: the same running guest
    ssh = lambda command: ssh_run(details["port"], details["user"], command, host=details["address"], **key)  # noqa: E731
    ssh("echo before-suspend > /tmp/kept")
    uptime = float(ssh("cut -d' ' -f1 /proc/uptime"))
    act(client, vm.pk, "suspend", worker)
    dom = domain_of(libvirt_conn, vm.key)
    assert not dom.isActive() and dom.hasManagedSaveImage(0) and VM.objects.get(pk=vm.pk).state == "suspended"
    act(client, vm.pk, "resume", worker)
    assert VM.objects.get(pk=vm.pk).state == "running"
    assert ssh("cat /tmp/kept").strip() == "before-suspend"
    assert float(ssh("cut -d' ' -f1 /proc/uptime")) >= uptime  # not rebooted: the clock ran on

    # snapshot, a change, revert: the change is gone (disk and memory), what came before stays
    run_job(vms.submit_action(VM.objects.get(pk=vm.pk), "snapshot", name="before", actor=alice).pk, worker)
    ssh("echo after-snapshot > /tmp/later")
    write_mark(details, "after-snapshot", **key)
    run_job(vms.submit_action(VM.objects.get(pk=vm.pk), "revert", name="before", actor=alice).pk, worker)
    assert VM.objects.get(pk=vm.pk).state == "running"
    assert ssh("cat /tmp/kept; ls /tmp").split() == ["before-suspend", "kept"]
    assert read_mark(details, **key) == ""

    # capture: the VM is stopped and its disk becomes a derived image
    write_mark(details, "captured-disk", **key)
    capture = act(client, vm.pk, "capture", worker, image_name="guest-captured", force=True)
    image = Image.objects.get(pk=capture.result["image"])
    assert image.parent_id == guest.pk and VM.objects.get(pk=vm.pk).state == "stopped"
    vms.update_image(image, actor="test", visibility=Image.Visibility.PUBLIC)  # staff publish it
    end_and_check_gone(client, rid, worker, libvirt_conn, pool)
    assert not Allocation.objects.filter(released__isnull=True).exists()

    # the derived image boots, lets its user in, and holds the captured disk
    other = new_login()
    derived = reserve(client, image, ssh_key=other["public"])
    got = wait_ready(client, derived, worker)["connection"]
    assert ssh_run(got["port"], got["user"], "id -un", host=got["address"], pkey=other["pkey"]).split() == ["alice"]
    assert read_mark(got, pkey=other["pkey"]) == "captured-disk"
    end_and_check_gone(client, derived, worker, libvirt_conn, pool)
    assert timezone.now() < new_end
