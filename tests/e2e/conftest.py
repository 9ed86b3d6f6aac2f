"""Browser tests: Debian's Chromium driven by Playwright against a real daphne server."""

import os
import shutil

import pytest

from tests.images import sim_image

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

# Playwright's sync API keeps an event loop on the test thread; the test's own ORM calls
# are still synchronous and safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), "Chromium is missing: `make test` installs Debian's chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, asgi_server):
    context = browser.new_context(base_url=asgi_server.url, viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(15000)
    yield page
    context.close()


@pytest.fixture
def sso_page(browser, vclmgr):
    """A page on the test module's own ``vclmgr`` server (the sign-on tests start one beside
    their identity provider)."""
    context = browser.new_context(base_url=vclmgr.url)
    page = context.new_page()
    page.set_default_timeout(20000)
    yield page
    context.close()


def sign_in(page, username, password):
    """Sign ``page`` in through the login form; returns it, on the home page."""
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/")
    return page


@pytest.fixture
def login(page):
    def do(username, password):
        return sign_in(page, username, password)

    return do


@pytest.fixture
def image(db):
    """debian-12, one simulated variant: the image of the pages' tests that are not about images."""
    return sim_image("debian-12", size_gib=0, os="Debian 12", default_disk_gib=5)
