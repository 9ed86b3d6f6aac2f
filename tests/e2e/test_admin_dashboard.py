"""The admin's dashboard follows the cluster live: another user reserves, a real worker builds the VM,
and the numbers, the heat map, the timeline and the job queue change without a reload."""

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import expect

from inventory import services as inventory
from reservations import services as reservations
from reservations.models import Reservation
from tests.conftest import TEST
from tests.jobs.helpers import wait_until
from tests.reservations import conftest as reservation_fixtures

# A simulated image, as the reservations tests have it.
image = reservation_fixtures.image

pytestmark = pytest.mark.slow

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture
def cluster(chassis, group, make_host):
    """bc1 with three simulated hosts (one drained), and a host outside any chassis."""
    size = {"driver": "sim", "cpus": 8, "memory_mib": 8192, "disk_gib": 200, "group": group}
    make_host("bc1-s01", blade_center=chassis, slot=1, **size)
    make_host("bc1-s02", blade_center=chassis, slot=2, **size)
    drained = make_host("bc1-s05", blade_center=chassis, slot=5, **size)
    inventory.set_state(drained, "drained", "firmware update", actor=TEST)
    make_host("spare-1", driver="sim", cpus=4, memory_mib=4096, disk_gib=100)


def vcpus_cell(page, group="overall"):
    return page.locator(f'#dash-utilisation tr[data-group="{group}"] td[data-resource="vcpus"] .amount')


def test_the_admins_dashboard_follows_a_reservation_live(admin_user, alice, login, cluster, image, worker, asgi_server):
    page = login("admin", "admin-pass-1")
    page.wait_for_selector("html[data-live=subscribed]", state="attached")
    # Usable: 3 chassis hosts × 8 cpus × 4 + the spare's 4 × 4 = 112 vCPUs; nothing allocated yet.
    expect(vcpus_cell(page)).to_have_text("0 / 112 (0%)")
    expect(page.locator('.heat-row[data-chassis="bc1"] .heat-cell')).to_have_count(16)
    expect(page.locator('.heat-row[data-chassis="bc1"] .heat-cell.drained')).to_have_attribute("data-host", "bc1-s05")
    expect(page.locator('.heat-row[data-chassis="no chassis"] [data-host="spare-1"]')).to_have_count(1)
    expect(page.locator("#dash-timeline-now")).to_contain_text("Now: 0 reservations")
    page.evaluate("window.__sameDocument = true")

    reservation = reservations.reserve(alice, image, actor=alice, duration=timedelta(hours=2))
    try:
        expect(vcpus_cell(page)).to_have_text("2 / 112 (2%)", timeout=10000)
        expect(page.locator("#dash-timeline-now")).to_contain_text("Now: 1 reservation")
        host = reservation.allocation.host.name
        expect(page.locator(f'.heat-cell[data-host="{host}"]')).not_to_have_attribute("data-utilisation", "0")
        expect(page.locator("#dash-latest-jobs tbody")).to_contain_text("vm.create")
        wait_until(lambda: Reservation.objects.get(pk=reservation.pk).status == "ready", 60, "the VM", worker)
        expect(page.locator("#dash-latest-jobs tbody tr", has_text="vm.create")).to_contain_text(
            "success", timeout=10000
        )
        expect(page.locator('#dash-jobs [data-count="running"]')).to_have_text("0")
    except AssertionError as error:
        raise AssertionError(f"{error}\nserver log:\n{asgi_server.output()[-4000:]}") from error
    assert page.evaluate("window.__sameDocument") is True  # updated in place, never reloaded
    assert int(page.locator("#admin-dashboard").get_attribute("data-refreshes")) >= 1
    # Saved with the run's other files; the docs' copy changes only when asked.
    folder = SCREENSHOTS if os.environ.get("UPDATE_DOCS_SCREENSHOTS") else settings.VAR_DIR / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / "dashboard.png"), full_page=True)


def test_a_user_sees_only_their_own_activity(alice, login, cluster, asgi_server):
    page = login("alice", "alice-pass-1")
    expect(page.locator("#activity")).to_have_attribute("data-topics", f"user.{alice.pk}")
    expect(page.locator("#admin-dashboard")).to_have_count(0)
    response = page.request.get("/dashboard/data/")
    assert response.status == 403
