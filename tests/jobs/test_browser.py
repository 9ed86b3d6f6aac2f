"""The jobs pages in a real browser: live status and a live log, from real worker processes.

Playwright's sync API allows one instance per thread with an event loop; the e2e suite
keeps one for the whole session, so this test drives its own browser from a thread of its
own (whatever ran before in this process).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from playwright.sync_api import expect, sync_playwright

from jobs import services
from tests.e2e.conftest import ARGS, CHROMIUM

pytestmark = pytest.mark.slow


def in_browser(base_url, cookie, scenario):
    def run():
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
                try:
                    context = browser.new_context(base_url=base_url)
                    name, _, value = cookie.partition("=")
                    context.add_cookies([{"name": name, "value": value, "url": base_url}])
                    page = context.new_page()
                    page.set_default_timeout(15000)
                    scenario(page)
                finally:
                    browser.close()
        finally:
            connection.close()  # this thread's own database connection

    with ThreadPoolExecutor(1) as pool:
        pool.submit(run).result()


def test_the_job_page_and_the_list_update_live(alice, session_cookie, start_workers, asgi_server):
    # Running long enough to be seen: the relay may hold an event up to ORDER_WAIT (2 s) behind a
    # gap, and a shorter job's running and success then arrived together (the page skipped running).
    job = services.submit("test.sleep", {"steps": 3, "seconds": 2}, actor=alice)

    def scenario(page):
        page.goto(f"/provisioning/jobs/{job.pk}/")
        expect(page.locator("#job-status")).to_have_text("queued")
        page.wait_for_selector("html[data-live=subscribed]", state="attached")
        start_workers(2)
        # Pushed over the websocket while the job runs (the page reloads only once it ends).
        expect(page.locator("#job-status")).to_have_text("running", timeout=20000)
        expect(page.locator("#log")).to_contain_text("step 1/3 'sleep 1' done", timeout=10000)
        expect(page.locator("#job-status")).to_have_text("success", timeout=15000)
        expect(page.locator("#log li").last).to_contain_text("success")

        page.goto("/provisioning/jobs/")
        page.wait_for_selector("html[data-live=subscribed]", state="attached")
        second = services.submit("test.sleep", {"steps": 2, "seconds": 0.5}, actor=alice)
        row = page.locator(f"#job-{second.pk}")
        expect(row).to_be_visible(timeout=10000)  # a new row, added live
        expect(row.locator('[data-field="status"]')).to_have_text("success", timeout=20000)

    in_browser(asgi_server.url, session_cookie(alice), scenario)
