"""Every page works under the strict Content-Security-Policy: a real browser
reports no violation (no inline script, style or handler is left), live updates still arrive
over the same-origin websocket, and the behaviour moved out of the pages still works."""

import pytest
from playwright.sync_api import expect

from jobs import services as jobs
from provisioning import services as vms
from provisioning.models import Image
from tests.conftest import TEST

pytestmark = pytest.mark.slow


@pytest.fixture
def things(admin_user, make_host, chassis, image):
    host = make_host("csp-1", blade_center=chassis, slot=1)
    vm, _ = vms.request_vm(actor=admin_user, owner=admin_user, image=image)  # no worker: it stays requested
    job = jobs.submit("noop", {}, actor=admin_user)
    return {"host": host, "chassis": chassis, "image": image, "vm": vm, "job": job}


def _violations(page):
    seen = []
    page.on("console", lambda message: seen.append(message.text) if "Content Security Policy" in message.text else None)
    page.on("pageerror", lambda error: seen.append(f"page error: {error}"))
    return seen


def test_no_page_breaks_the_policy(admin_user, login, things):
    page = login("admin", "admin-pass-1")
    seen = _violations(page)
    urls = [
        "/",
        "/provisioning/jobs/",
        f"/provisioning/jobs/{things['job'].pk}/",
        "/vms/",
        f"/vms/{things['vm'].pk}/",
        "/vms/images/",
        f"/vms/images/{things['image'].pk}/",
        f"/inventory/hypervisors/{things['host'].pk}/",
        f"/inventory/blade-centers/{things['chassis'].pk}/",
        "/inventory/",
        "/reservations/",
        "/reservations/images/",
        "/reservations/new/",
        "/reservations/blocks/",
        "/tokens/",
        "/account/",
        "/admin/",
        "/admin/jobs/job/",
        f"/admin/vms/vm/{things['vm'].pk}/change/",
    ]
    for url in urls:
        response = page.goto(url)
        assert response.status == 200, url
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_load_state("networkidle")
    assert seen == []


def test_live_updates_arrive_over_the_websocket(admin_user, login, things):
    page = login("admin", "admin-pass-1")
    seen = _violations(page)
    page.goto(f"/provisioning/jobs/{things['job'].pk}/")
    page.wait_for_selector("html[data-live=subscribed]", state="attached")
    jobs.cancel(things["job"], actor=TEST, reason="csp")
    expect(page.locator("#job-status")).to_have_text("canceled", timeout=10000)
    assert seen == []


def test_the_api_docs_render(admin_user, login):
    page = login("admin", "admin-pass-1")
    seen = _violations(page)
    page.goto("/api/v1/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("vclmgr API", timeout=15000)
    assert seen == []


def test_a_confirmation_declined_submits_nothing(admin_user, login, things):
    page = login("admin", "admin-pass-1")
    page.goto(f"/vms/images/{things['image'].pk}/")
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click("form[data-confirm] button[type=submit]")
    page.wait_for_timeout(300)
    assert asked == ["Delete image debian-12?"]
    assert Image.objects.filter(pk=things["image"].pk).exists()
