"""Idle reclamation on real QEMU VMs: two reservations of the test guest through the
API, a real worker process whose idle round asks the guests every second through the QEMU guest
agent (``guest-get-users``, i.e. the guest's utmp). Nobody logs in to the first: it is ended as a
no-show after the (one-minute) limit. The second has an interactive SSH session open: it is kept
past that limit, the agent lists its login, and once the session is closed it is reclaimed as idle.
The worker counts a policy's minute as ``MINUTE`` seconds (``IDLE_MINUTE_SECONDS``): the same
limits of one minute, the same checks, reached in seconds."""

import time
from datetime import timedelta

import pytest

from drivers import registry
from reservations import idle
from reservations.models import Reservation
from tests.integration.test_reserve_real_vm import kvm_host, reserve, vm_ids, wait_ready  # noqa: F401
from tests.jobs.helpers import wait_until
from tests.localkvm_inventory import kvm_guest_image
from tests.realvm import new_login, ssh_client

pytestmark = pytest.mark.slow
URL = "/api/v1/reservations/"
MINUTE = 20  # s: long enough for the second guest's SSH login to be seen before its no-show limit


@pytest.fixture
def guest(guest_image):
    """The test guest, with room to boot two at once on a loaded machine (software emulation)."""
    return kvm_guest_image(guest_image, "guest-idle", ready_timeout=280)


def open_shell(details, pkey):
    """An interactive session (a terminal: dropbear records it in utmp), kept open by the caller."""
    client = ssh_client(details["port"], details["user"], details["address"], pkey=pkey)
    shell = client.invoke_shell()
    shell.send(b"echo hello-$((6*7))\n")
    seen = b""
    deadline = time.monotonic() + 30
    while b"hello-42" not in seen and time.monotonic() < deadline:
        if shell.recv_ready():
            seen += shell.recv(4096)
        time.sleep(0.1)
    assert b"hello-42" in seen, seen
    return client


def status(rid):
    return Reservation.objects.get(pk=rid).status


def test_a_no_show_is_reclaimed_and_a_reservation_with_an_ssh_session_is_not(
    transactional_db,
    tmp_path,
    api,
    alice,
    kvm_host,  # noqa: F811
    guest,
    libvirt_conn,
    settings,  # noqa: F811 (an imported fixture)
):
    from tests import processes

    host, _pool = kvm_host
    settings.IDLE_MINUTE_SECONDS = MINUTE
    idle.set_policy(actor="test", image=guest, no_show_minutes=1, idle_minutes=1, warn_minutes=0)
    child = processes.start_worker(tmp_path, workers=2, IDLE_CHECK_SECONDS=1, VCLMGR_TEST_IDLE_MINUTE_SECONDS=MINUTE)
    shell = None
    try:
        client = api(alice)
        login = new_login()
        nobody, used = reserve(client, guest, ssh_key=login["public"]), reserve(client, guest, ssh_key=login["public"])
        details = wait_ready(client, used, child)["connection"]
        shell = open_shell(details, login["pkey"])
        used_vm = Reservation.objects.get(pk=used).vm
        sessions = registry.driver_for(host).guest_sessions(used_vm.key)
        assert [s.user for s in sessions] == ["alice"] and sessions[0].login_time > time.time() - 600
        wait_ready(client, nobody, child)

        wait_until(lambda: status(nobody) == "ended", 240, "the no-show to be reclaimed", child, interval=0.5)
        gone = Reservation.objects.get(pk=nobody)
        assert gone.reclaimed == "no_show" and gone.connected_at is None
        assert gone.history.filter(reason__startswith="reclaimed: no-show").exists()
        assert gone.vm.key not in [d.name() for d in libvirt_conn.listAllDomains()]

        kept = Reservation.objects.get(pk=used)
        ready_at = kept.history.filter(status="ready").first().at
        wait_until(
            lambda: Reservation.objects.get(pk=used).idle_since > ready_at + timedelta(seconds=1.2 * MINUTE),
            120,
            "the kept reservation's idle clock to move past both limits",
            child,
            interval=0.5,
        )
        kept = Reservation.objects.get(pk=used)
        assert kept.status == "ready" and kept.connected_at is not None and not kept.reclaimed

        shell.close()  # logged out: dropbear marks the utmp entry dead; the idle clock now runs
        shell = None
        wait_until(lambda: status(used) == "ended", 240, "the idle reservation to be reclaimed", child, interval=0.5)
        assert Reservation.objects.get(pk=used).reclaimed == "idle"
    finally:
        if shell is not None:
            shell.close()
        child.stop()
