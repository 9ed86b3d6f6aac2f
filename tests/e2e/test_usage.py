"""The usage page in Chromium: its charts are drawn (Chart.js, vendored) with no CSP violation;
a user's home follows their reservations live."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from reservations import services
from reservations.models import Reservation, UsagePeak
from tests.conftest import TEST
from tests.e2e.test_csp import _violations
from tests.reservations.test_usage import made

pytestmark = pytest.mark.slow
H = timedelta(hours=1)
CHARTS = ("usage-days", "usage-images", "usage-groups", "usage-refusals")


def history(image, alice, bob):
    from reservations.models import Refusal

    alice.groups.add(Group.objects.create(name="physics"))
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    for day in range(1, 8):
        t = today - day * 24 * H
        for n, user in enumerate((alice, bob, alice)[: 1 + day % 3]):
            made(user, image, t + (9 + n) * H, t + (11 + n) * H, ready=t + (9 + n) * H + timedelta(seconds=40 + n))
        Refusal.objects.create(
            at=t + 12 * H, user=bob, image=image.name, reason="lacks_memory_mib" if day % 2 else "drained"
        )


def test_the_usage_page_draws_its_charts_under_the_csp(admin_user, alice, bob, image, login):
    history(image, alice, bob)
    from reservations import rollup

    rollup.backfill(timezone.now().date() - timedelta(days=30), timezone.now().date())
    assert UsagePeak.objects.exists()
    page = login("admin", "admin-pass-1")
    seen = _violations(page)
    page.goto("/")
    page.click("#usage-link")
    page.wait_for_url("**/reservations/usage/")
    page.wait_for_load_state("networkidle")
    for canvas in CHARTS:
        drawn = page.evaluate(f"() => !!Chart.getChart(document.getElementById('{canvas}'))")
        assert drawn, canvas
        assert page.locator(f"#{canvas}").bounding_box()["height"] > 100
    assert "reservation hours" in page.locator("#usage-totals").inner_text()
    page.select_option("select[name=group]", "physics")
    page.click("#usage-filters button[type=submit]")
    page.wait_for_url("**group=physics**")
    assert (
        page.evaluate("() => JSON.parse(document.getElementById('usage-data').textContent).filters.group") == "physics"
    )
    assert seen == []


def test_a_users_home_follows_their_reservation_live(alice, image, login):
    start = timezone.now() + 24 * H
    reservation = Reservation.objects.create(
        user=alice, image=image, start=start, end=start + H, status="pending", vcpus=1, memory_mib=256, disk_gib=1
    )
    page = login("alice", "alice-pass-1")
    seen = _violations(page)
    row = page.locator(f"#home-reservation-{reservation.pk}")
    expect(row).to_have_attribute("data-action", "wait")
    page.wait_for_selector("html[data-live=subscribed]", state="attached")
    services.cancel(reservation, actor=TEST)
    expect(row).to_have_count(0, timeout=10000)  # canceled: nothing more to do
    assert seen == []


def test_a_student_sees_their_own_usage_charted_under_the_csp(alice, bob, image, login):
    history(image, alice, bob)
    page = login("bob", "bob-pass-1")
    seen = _violations(page)
    page.click("#showback-link")
    page.wait_for_url("**/reservations/showback/")
    page.wait_for_load_state("networkidle")
    assert page.evaluate("() => !!Chart.getChart(document.getElementById('showback-chart'))")
    assert page.locator("#showback-chart").bounding_box()["height"] > 100
    keys = page.locator("#showback-rows tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
    assert keys == [str(bob.pk)]  # bob's own row only, not alice's
    page.select_option("select[name=by]", "image")
    page.click("#showback-filters button[type=submit]")
    page.wait_for_url("**by=image**")
    assert page.locator("#showback-rows tbody tr").count() == 1
    assert seen == []
