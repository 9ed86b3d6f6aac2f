"""The browser test of Reservations, once against a real VM: alice reserves the test
guest image in headless Chromium, the page turns ``ready`` without a reload once the real QEMU
guest on the private libvirtd answers, and the password and address/port the page shows let
her in over SSH (paramiko). Ending it in the page leaves nothing in libvirt.

Its screenshot of the ready page (login details revealed: a one-time password of a throwaway
VM) is the docs' ``docs/screenshots/reservation-real-vm.png`` when UPDATE_DOCS_SCREENSHOTS
is set.
"""

import os
import re
import shutil

import pytest
from playwright.sync_api import expect

from capacity.models import Allocation
from reservations.models import Reservation
from tests.e2e.test_reservations import ROOT, shot
from tests.integration.conftest import guest_image, libvirt_conn, libvirtd  # noqa: F401 (fixtures)
from tests.integration.test_reserve_real_vm import guest, kvm_host, vm_ids  # noqa: F401 (fixtures)
from tests.realvm import ssh_run

pytestmark = pytest.mark.slow
READY_TIMEOUT_MS = 300_000  # ~10 s alone; the two cores may be shared with a whole test run


def wait_ready_live(page, reservation, worker):
    """The reservation's page turns ``ready`` without a reload (or the error and the worker's log)."""
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    page.wait_for_selector("html[data-live=subscribed]", state="attached")
    try:
        expect(page.locator("#reservation-status")).to_have_text("ready", timeout=READY_TIMEOUT_MS)
    except AssertionError as error:
        raise AssertionError(
            f"not ready: {Reservation.objects.get(pk=reservation.pk).error}\n{worker.output()[-3000:]}"
        ) from error
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"


def test_a_user_reserves_a_real_vm_sees_it_ready_live_and_logs_in_with_the_shown_password(
    kvm_host,  # noqa: F811
    guest,  # noqa: F811
    alice,
    worker,
    asgi_server,
    login,
    page,
    libvirt_conn,  # noqa: F811
):
    _host, pool = kvm_host
    login("alice", "alice-pass-1")
    page.goto(f"/reservations/new/?image={guest.pk}")
    expect(page.locator("#fit [data-fit=yes]")).to_contain_text("Fits: a host has room")
    page.click("#reserve-submit")
    page.wait_for_url(re.compile(r"/reservations/\d+/$"), timeout=30000)
    reservation = Reservation.objects.get(user=alice)
    wait_ready_live(page, reservation, worker)

    page.click("button.reveal")
    password = page.locator("#connect-password").inner_text().strip()
    address = page.locator("#connect-address").inner_text().strip()
    port = int(page.locator("#connect-port").inner_text().strip())
    assert password and address == "127.0.0.1" and port != 22
    expect(page.locator("#connect-command")).to_have_text(f"ssh -p {port} alice@{address}")
    out = ssh_run(port, "alice", "id -un; hostname", host=address, password=password)
    assert out.split() == ["alice", Reservation.objects.get(pk=reservation.pk).vm.key]
    path = shot(page, "reservation-real-vm")
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS"):  # the docs' copy changes only when asked
        (ROOT / "docs" / "screenshots").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, ROOT / "docs" / "screenshots" / "reservation-real-vm.png")

    key = Reservation.objects.get(pk=reservation.pk).vm.key
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#end-now")
    expect(page.locator("#reservation-status")).to_have_text("ended", timeout=120000)
    assert key not in [d.name() for d in libvirt_conn.listAllDomains()]
    assert [v for v in pool.volumes() if v.startswith(key)] == []
    assert not Allocation.objects.filter(released__isnull=True).exists()
