"""The VM pages in a real browser: state pushed live, an action submitted as a job."""

import pytest
from playwright.sync_api import expect

from jobs.models import Job
from provisioning import services

pytestmark = pytest.mark.slow


@pytest.fixture
def requested_vm(alice, make_host, image):
    host = make_host("sim-e2e")
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image)  # no worker: it stays requested
    return vm, host


def test_a_user_watches_a_vm_come_up_and_stops_it(alice, login, requested_vm):
    vm, host = requested_vm
    page = login("alice", "alice-pass-1")
    page.click("nav >> text=VMs")
    row = page.locator(f"#vm-{vm.pk}")
    expect(row.locator('[data-field="state"]')).to_have_text("requested")
    page.wait_for_selector("html[data-live=subscribed]", state="attached")
    services.set_state(vm.pk, "staging", "placed", actor="test", host=host)
    expect(row.locator('[data-field="state"]')).to_have_text("staging", timeout=10000)

    row.locator("a").first.click()
    page.wait_for_selector("html[data-live=subscribed]", state="attached")
    services.set_state(vm.pk, "running", "ready", actor="test", address="10.0.0.7")
    expect(page.locator("#vm-address")).to_have_text("10.0.0.7", timeout=10000)
    page.locator("button", has_text="Stop").wait_for()  # the page reloads with the running VM's actions
    page.click("button:text-is('Stop')")
    job = Job.objects.get(opcode="vm.stop")
    expect(page.locator(".messages")).to_contain_text(f"job {job.pk}")
    page.click(f".messages >> text=job {job.pk}")
    expect(page.locator("h1")).to_contain_text(f"Job {job.pk}")


def test_the_image_library_searches(alice, login, requested_vm):
    services.create_image(actor="test", name="alma-9", os="AlmaLinux 9")
    page = login("alice", "alice-pass-1")
    page.goto("/vms/images/")
    page.fill("input[name=q]", "alma")
    page.click("button:text-is('Filter')")
    expect(page.locator("table.images tbody tr")).to_have_count(1)
    expect(page.locator("table.images tbody")).to_contain_text("alma-9")
