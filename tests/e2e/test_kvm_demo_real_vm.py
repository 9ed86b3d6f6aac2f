"""The docs' "Try it with a real VM" (docs/getting-started.md), followed literally: the embedded demo (its simulated
blade center of 16 hosts included: ``manage.py demo``), then what ``manage.py kvm_demo`` does
(the private libvirtd registered as ``kvm-local``, the test guest as ``debian-guest``), served
by a real daphne and a real worker. The demo user signs in with the password the demo printed,
picks ``debian-guest`` in the catalogue and reserves it in headless Chromium; the page turns
ready without a reload, on ``kvm-local`` (never a simulated blade: the image has a kvm variant
only), and the SSH command and one-time password it shows log in to the real guest (paramiko).
Ten more reservations of ``debian-guest`` through the service all land on ``kvm-local`` too.
One test: one booted guest, one server, one worker for everything the recipe promises.
"""

import contextlib
import io
import re
import shutil
from datetime import timedelta

import libvirt
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

from drivers.libvirt.connection import connections
from provisioning.models import Image
from reservations import services as reservations
from reservations.models import Reservation
from tests.e2e.test_reservations_real_vm import wait_ready_live
from tests.integration.conftest import guest_image, libvirt_conn, libvirtd  # noqa: F401 (fixtures)
from tests.integration.test_reserve_real_vm import vm_ids  # noqa: F401 (a fixture)
from tests.realvm import ssh_run
from vclmgr.management.commands import kvm_demo

pytestmark = pytest.mark.slow


@pytest.fixture
def demo(transactional_db, settings, tmp_path, libvirtd, libvirt_conn, guest_image, vm_ids):  # noqa: F811
    """``make run-kvm``'s data: ``demo``, then ``kvm_demo`` without its ``serve``; what the
    two commands printed. The demo's password file goes to this test's own directory."""
    settings.VAR_DIR = tmp_path
    out = io.StringIO()
    call_command("demo", stdout=out)
    call_command("kvm_demo", no_serve=True, stdout=out)
    yield out.getvalue()
    from tools.localkvm import STATE

    pool_dir = str(STATE / "demo-pool")
    for dom in libvirt_conn.listAllDomains():  # a failed test must not leave its guest running
        with contextlib.suppress(libvirt.libvirtError):  # another process's, gone as we listed it
            if dom.name().startswith("vcl-") and pool_dir in dom.XMLDesc(0):
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)
    with contextlib.suppress(libvirt.libvirtError):
        libvirt_conn.storagePoolLookupByName(kvm_demo.POOL).destroy()
    shutil.rmtree(pool_dir, ignore_errors=True)
    connections.forget(libvirtd.uri)


def demo_password(printed):
    """The demo user's password as ``manage.py demo`` printed it (``user  login: demo / …``)."""
    return re.search(r"user\s+login: demo / (\S+)", printed).group(1)


def test_the_readme_recipe_gives_a_real_vm_on_kvm_local_that_the_shown_login_opens(
    demo, worker, asgi_server, login, page
):
    assert "blade center bc1: 16 simulated hypervisors" in demo and "Real VMs: host kvm-local" in demo
    login("demo", demo_password(demo))
    page.click("nav >> text=Reserve")
    card = page.locator(".image-card", has=page.locator("h2", has_text=re.compile(r"^debian-guest$")))
    expect(card).to_contain_text("Debian 12 (test guest)")
    card.locator("a.button", has_text="Reserve").click()
    expect(page.locator("#id_image option:checked")).to_have_text("debian-guest")
    expect(page.locator("#id_start")).to_be_hidden()  # "now" is chosen: no start to give
    page.click("#reserve-submit")
    page.wait_for_url(re.compile(r"/reservations/\d+/$"), timeout=30000)
    reservation = Reservation.objects.get(user__username="demo", image__name="debian-guest")
    wait_ready_live(page, reservation, worker)
    reservation.refresh_from_db()
    assert reservation.vm.host.name == "kvm-local"

    page.click("button.reveal")
    password = page.locator("#connect-password").inner_text().strip()
    command = page.locator("#connect-command").inner_text().strip()
    shown = re.fullmatch(r"ssh -p (\d+) (\S+)@127\.0\.0\.1", command)
    assert shown, f"the page shows {command!r}, not an SSH command to a port on 127.0.0.1"
    port, user = int(shown.group(1)), shown.group(2)
    assert user == "demo"
    out = ssh_run(port, user, "id -un; hostname", host="127.0.0.1", password=password)
    assert out.split() == [user, reservation.vm.key]

    # Ten more, each in its own hour from tomorrow (the demo's quota: two at once), placed by the
    # same service the page calls: every one on kvm-local, none on the emptier simulated blades.
    demo_user, guest = get_user_model().objects.get(username="demo"), Image.objects.get(name="debian-guest")
    first = timezone.now() + timedelta(days=1)
    hosts = [
        reservations.reserve(
            demo_user, guest, actor=demo_user, start=first + timedelta(hours=2 * i), duration=timedelta(hours=1)
        ).allocation.host.name
        for i in range(10)
    ]
    assert hosts == ["kvm-local"] * 10
