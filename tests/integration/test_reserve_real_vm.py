"""Issue #14's loop through vclmgr itself: a user reserves the test guest image through the
REST API, a real worker process builds a real QEMU VM on the private libvirtd (registered as
a ``libvirt`` hypervisor, the image staged into its pool by the driver), the reservation
becomes ``ready`` only once the guest's SSH server answers, and the test logs in with the
connection details the API returned: by SSH key, and by the one-time password. Ending it
leaves no domain, overlay or seed volume in libvirt, and releases the claim. A guest that
never answers fails with the reason and leaves nothing; three at once all let their users in."""

import os
import time

import libvirt
import pytest
from django.db import connection

from capacity.models import Allocation
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import VM
from reservations.models import Reservation
from tests import localkvm_inventory, realvm
from tests.jobs.helpers import wait_until
from tests.localkvm_inventory import kvm_guest_image
from tests.realvm import new_login, ssh_run

pytestmark = pytest.mark.slow
URL = "/api/v1/reservations/"
READY_TIMEOUT = 300  # s: ~10 s alone, but the two cores may be shared with a whole test run


@pytest.fixture
def vm_ids(transactional_db):
    """Names on the one shared libvirtd come from ids: VM keys (vcl-<VM id>) and an
    environment's private networks (env<reservation id>-<network>). Start this test's ids at a
    number no other process running now uses (xdist workers have databases of their own)."""
    start = os.getpid() * 100
    with connection.cursor() as cursor:
        for table in ("vms_vm", "reservations_reservation"):
            if connection.vendor == "sqlite":
                cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
                cursor.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, start])
            else:
                cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, start])
    return start


@pytest.fixture
def kvm_host(libvirtd, libvirt_conn, guest_image, vm_ids):
    """The private libvirtd as an inventory host: software emulation, an empty pool of its own,
    user-mode networking (the guest reached through a forward on 127.0.0.1)."""
    pool = realvm.Pool(libvirt_conn, guest_image, name=f"{realvm.PREFIX}vcl-{os.getpid()}", stage=False)
    host = localkvm_inventory.kvm_host(libvirtd.uri, pool.name)
    yield host, pool
    for dom in libvirt_conn.listAllDomains():  # a failed test must not leave its VMs running
        try:
            if not (dom.name().startswith("vcl-") and str(pool.path) in dom.XMLDesc(0)):
                continue
            if dom.isActive():
                dom.destroy()
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
        except libvirt.libvirtError as exc:
            # Another xdist worker's VM, listed as it went (its own teardown): not ours to clean.
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
    pool.close()


@pytest.fixture
def guest(guest_image):
    """The guest booting from its disk, as a real image does (the tests that share this
    fixture capture its disk, or prove a reservation of a real image end to end)."""
    return kvm_guest_image(guest_image, "guest-debian", boot="disk")


@pytest.fixture
def quick_guest(guest_image):
    """The guest booting its kernel directly: the same guest, booted in about half the CPU."""
    return kvm_guest_image(guest_image, "guest-debian")


def reserve(client, image, ssh_key=""):
    response = client.post(URL, {"image": image.pk, "duration_minutes": 60, "ssh_key": ssh_key}, format="json")
    assert response.status_code == 202, response.content
    return response.json()["reservation"]["id"]


def wait_ready(client, rid, worker):
    def status():
        body = client.get(f"{URL}{rid}/").json()
        if body["status"] in ("failed", "ended"):
            raise AssertionError(f"reservation {rid} {body['status']}: {body['error']}\n{worker.output()[-3000:]}")
        return body if body["status"] == "ready" else None

    return wait_until(status, READY_TIMEOUT, f"reservation {rid} to be ready", worker, interval=0.2)


def end_and_check_gone(client, rid, worker, conn, pool):
    vm = Reservation.objects.get(pk=rid).vm
    assert client.post(f"{URL}{rid}/end/").status_code == 202
    wait_until(lambda: client.get(f"{URL}{rid}/").json()["status"] == "ended", 120, "the end", worker, interval=0.2)
    assert vm.key not in [d.name() for d in conn.listAllDomains()]
    pool.pool.refresh(0)
    assert [v.name() for v in pool.pool.listAllVolumes() if v.name().startswith(vm.key)] == []
    assert Allocation.objects.get(pk=Reservation.objects.get(pk=rid).allocation_id).released is not None
    assert VM.objects.get(pk=vm.pk).state == "destroyed"


def assert_no_secret_kept(*secrets):
    """Neither the clear password nor any crypt hash is in a job's params, steps or result."""
    for job in Job.objects.all():
        text = f"{job.params} {job.steps} {job.result} {job.error_message} {job.reason}"
        assert "$6$" not in text
        for secret in secrets:
            assert secret not in text


def test_a_reservation_gives_a_real_vm_to_log_into_by_key_then_by_password(
    worker, api, alice, kvm_host, guest, libvirt_conn
):
    _host, pool = kvm_host
    client = api(alice)
    user = new_login()

    started = time.monotonic()
    rid = reserve(client, guest, ssh_key=user["public"])
    body = wait_ready(client, rid, worker)
    reserve_to_ready = time.monotonic() - started
    details = body["connection"]
    assert details["user"] == "alice" and details["protocol"] == "ssh" and details["address"] == "127.0.0.1"
    assert details["port"] != 22 and details["command"] == f"ssh -p {details['port']} alice@127.0.0.1"
    out = ssh_run(details["port"], details["user"], "id -un; hostname", host=details["address"], pkey=user["pkey"])
    vm = Reservation.objects.get(pk=rid).vm
    assert out.split() == ["alice", vm.key]
    assert {v.name() for v in pool.pool.listAllVolumes()} >= {f"{vm.key}.qcow2", f"{vm.key}-seed.iso"}
    end_and_check_gone(client, rid, worker, libvirt_conn, pool)

    started = time.monotonic()
    rid = reserve(client, guest)  # no key: a one-time password, the image staged already
    details = wait_ready(client, rid, worker)["connection"]
    cached_reserve_to_ready = time.monotonic() - started
    password = details["password"]
    assert password and not details["ssh_key"]
    out = ssh_run(details["port"], details["user"], "id -un", host=details["address"], password=password)
    assert out.split() == ["alice"]
    assert_no_secret_kept(password)
    end_and_check_gone(client, rid, worker, libvirt_conn, pool)
    print(f"reserve→ready: {reserve_to_ready:.1f} s (first, staging), {cached_reserve_to_ready:.1f} s (cached)")


def test_a_guest_that_never_answers_fails_with_the_reason_and_leaves_nothing(
    worker, api, alice, kvm_host, libvirt_conn, tmp_path
):
    """A disk that boots nothing: QEMU runs, the forward accepts, no SSH banner ever comes."""
    import subprocess

    host, pool = kvm_host
    blank = tmp_path / "blank.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(blank), "64M"], check=True, timeout=30)
    image = vms.create_image(
        actor="test",
        name="mute",
        min_memory_mib=128,
        default_memory_mib=128,
        min_disk_gib=0,
        default_disk_gib=1,
        ready_timeout=8,
    )
    vms.add_variant(image, actor="test", hypervisor_type="kvm", format="qcow2", location=str(blank))
    client = api(alice)
    rid = reserve(client, image)
    wait_until(
        lambda: client.get(f"{URL}{rid}/").json()["status"] == "failed",
        READY_TIMEOUT,
        "the failure",
        worker,
        interval=0.2,
    )
    reservation = Reservation.objects.get(pk=rid)
    assert "guest did not answer on port 22 within 8 s" in reservation.error, reservation.error
    key = reservation.vm.key
    assert key not in [d.name() for d in libvirt_conn.listAllDomains()]
    pool.pool.refresh(0)
    assert [v.name() for v in pool.pool.listAllVolumes() if v.name().startswith(key)] == []
    assert not Allocation.objects.filter(host=host, released__isnull=True).exists()


def test_three_reservations_at_once_all_become_ready_and_let_their_users_in(
    transactional_db, tmp_path, api, django_user_model, kvm_host, quick_guest, libvirt_conn
):
    from tests import processes

    _host, pool = kvm_host
    child = processes.start_worker(tmp_path, workers=3)
    try:
        people = [
            django_user_model.objects.create_user(f"user{n}", f"u{n}@example.org", "pw-123456789") for n in range(3)
        ]
        logins = [new_login() for _ in people]
        clients = [api(person) for person in people]
        rids = [reserve(c, quick_guest, ssh_key=login["public"]) for c, login in zip(clients, logins, strict=True)]
        for client, rid, person, login in zip(clients, rids, people, logins, strict=True):
            details = wait_ready(client, rid, child)["connection"]
            out = ssh_run(details["port"], details["user"], "id -un", host=details["address"], pkey=login["pkey"])
            assert out.split() == [person.username]
        for client, rid in zip(clients, rids, strict=True):
            end_and_check_gone(client, rid, child, libvirt_conn, pool)
    finally:
        child.stop()
