"""The web console against a real QEMU guest: alice's reservation of the test guest
on the private libvirtd becomes ready; its page links the console, where headless Chromium
shows the guest's screen through noVNC (the canvas is not one colour) and the serial view
echoes what she types (the guest's getty on ttyS0). Through the same websocket proxy a ticket
reaches the guest's real VNC server (its RFB greeting), once: reused, expired, or presented by
bob, it is refused; bob's console page is a 403. One guest for all of it (QEMU boots are slow
on two shared cores).

Its screenshot is the docs' ``docs/screenshots/console.png`` when UPDATE_DOCS_SCREENSHOTS is set.
"""

import os
import shutil
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console import services
from console.consumers import REFUSED_PREFIX
from console.models import ConsoleTicket
from provisioning.models import VM
from reservations.models import Reservation
from tests.e2e.conftest import sign_in
from tests.e2e.test_csp import _violations
from tests.e2e.test_reservations import ROOT, shot
from tests.integration.conftest import guest_image, libvirt_conn, libvirtd  # noqa: F401 (fixtures)
from tests.integration.test_reserve_real_vm import guest, kvm_host, reserve, vm_ids, wait_ready  # noqa: F401

pytestmark = pytest.mark.slow
SCREEN_TIMEOUT = 60  # s: the first frame arrives within a second; the guest may still be drawing

# The colours of the noVNC canvas, sampled: more than one once the guest's screen is drawn.
COLOURS = """() => {
  const canvas = document.querySelector("#vnc-screen canvas");
  if (!canvas || !canvas.width) return 0;
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const seen = new Set();
  for (let i = 0; i < data.length; i += 4 * 7) seen.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
  return seen.size;
}"""


def refused(said):
    code, texts = said
    assert code == 4403 and len(texts) == 1 and texts[0].startswith(REFUSED_PREFIX), said
    return texts[0].removeprefix(REFUSED_PREFIX).removesuffix("]\r\n")


def test_the_console_shows_a_real_guest_to_its_owner_only(
    kvm_host,  # noqa: F811
    guest,  # noqa: F811
    alice,
    bob,
    worker,
    asgi_server,
    api,
    browser,
    login,
    page,
    ws_connect,
    ws_refusal,
    session_cookie,
):
    rid = reserve(api(alice), guest)
    wait_ready(api(alice), rid, worker)
    vm = Reservation.objects.get(pk=rid).vm
    assert vm.state == VM.State.RUNNING

    login("alice", "alice-pass-1")
    seen = _violations(page)  # noVNC runs under the strict CSP
    page.goto(f"/reservations/{rid}/")
    page.click("#open-console")
    page.wait_for_url(f"**/vms/{vm.pk}/console/")
    expect(page.locator("#console")).to_have_attribute("data-vnc", "connected", timeout=30000)
    expect(page.locator("#console")).to_have_attribute("data-serial", "connected", timeout=30000)
    deadline = time.monotonic() + SCREEN_TIMEOUT
    while page.evaluate(COLOURS) < 2:
        assert time.monotonic() < deadline, "the console's canvas stayed one colour"
        page.wait_for_timeout(250)

    page.click("#serial-view")
    page.keyboard.press("Enter")  # the guest's getty answers with its login prompt
    expect(page.locator("#serial-view")).to_contain_text("login:", timeout=30000)
    page.keyboard.type("typed-in-the-console")
    expect(page.locator("#serial-view")).to_contain_text("typed-in-the-console", timeout=15000)  # echoed by the guest
    path = shot(page, "console")
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS"):
        (ROOT / "docs" / "screenshots").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, ROOT / "docs" / "screenshots" / "console.png")
    assert ConsoleTicket.objects.filter(user=alice, vm=vm, used__isnull=False).count() == 2
    assert ConsoleTicket.objects.filter(user=alice, vm=vm, seen__isnull=False).count() == 2  # each beats at once
    assert seen == []

    # A ticket reaches the guest's own VNC server, through the proxy, once.
    alice.refresh_from_db()  # signing in on the server may have rehashed her password (the session's hash)
    vnc = f"/ws/console/{vm.pk}/vnc/?ticket="
    ticket = services.issue(alice, vm, "vnc")
    first = ws_connect(vnc + ticket, cookie=session_cookie(alice))
    assert first.connection.recv(timeout=10) == b"RFB 003.008\n"
    first.close()
    assert refused(ws_refusal(vnc + ticket, cookie=session_cookie(alice))) == "this console ticket was used already"

    ticket = services.issue(alice, vm, "vnc")
    ConsoleTicket.objects.filter(expires__gt=timezone.now(), used__isnull=True).update(
        expires=timezone.now() - timedelta(seconds=1)
    )
    assert refused(ws_refusal(vnc + ticket, cookie=session_cookie(alice))) == "this console ticket expired"

    ticket = services.issue(alice, vm, "serial")
    serial = f"/ws/console/{vm.pk}/serial/?ticket={ticket}"
    assert refused(ws_refusal(serial, cookie=session_cookie(bob))) == "this console ticket was issued to another user"

    other = browser.new_context(base_url=asgi_server.url)
    try:
        bobs = sign_in(other.new_page(), "bob", "bob-pass-1")
        assert bobs.goto(f"/vms/{vm.pk}/console/").status == 403
    finally:
        other.close()
