"""The browser's time zone reaches the server (static/js/timezone.js): a user who has chosen
none sees their pages in it, and it is kept for their e-mails."""

import pytest
from django.core.cache import cache
from playwright.sync_api import expect

from accounts.models import Preferences
from tests.e2e.conftest import sign_in

pytestmark = pytest.mark.slow


def test_the_browsers_zone_is_picked_up(browser, asgi_server, alice):
    cache.clear()  # the server's cache (a file shared with this process) may know an earlier alice
    context = browser.new_context(base_url=asgi_server.url, timezone_id="Asia/Tokyo")
    try:
        page = context.new_page()
        page.set_default_timeout(15000)
        sign_in(page, "alice", "alice-pass-1")  # the login page has set the cookie already
        page.goto("/account/")
        expect(page.locator("#zone-in-use")).to_have_text("Asia/Tokyo")
        assert page.locator("html").get_attribute("data-time-zone") == "Asia/Tokyo"
        assert Preferences.objects.get(user=alice).browser_time_zone == "Asia/Tokyo"
    finally:
        context.close()
