import pytest
from playwright.sync_api import expect

from core import events

pytestmark = pytest.mark.slow


def test_a_user_logs_in_and_sees_their_events_live(alice, login, asgi_server):
    page = login("alice", "alice-pass-1")
    expect(page.locator("h1")).to_have_text("Dashboard")
    expect(page.locator("#live-indicator")).to_have_class("live on")
    page.wait_for_selector("html[data-live=subscribed]", state="attached")
    event = events.emit("reservation.status", {"status": "ready"}, [f"user.{alice.pk}"])[0]
    try:
        expect(page.locator("#activity li").first).to_contain_text("reservation.status", timeout=10000)
    except AssertionError as error:
        raise AssertionError(f"event {event.id} not shown; server log:\n{asgi_server.output()[-4000:]}") from error


def test_a_wrong_password_is_refused(alice, page):
    page.goto("/login/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_contain_text("didn't match")


def test_pages_need_a_login(page):
    page.goto("/")
    assert "/login/" in page.url
