"""Capture from the VM page in a real browser: the form, the job's progress pushed live, and the
new image, the user's own at once."""

import pytest
from playwright.sync_api import expect

from jobs.models import Job
from provisioning import services
from provisioning.models import VM, Image
from tests.jobs.conftest import sync_jobs  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow


def test_a_user_captures_their_vm_watches_it_and_reserves_the_new_image(
    alice,
    bob,
    login,
    make_host,
    image,
    sync_jobs,  # noqa: F811
):
    make_host("sim-capture")
    vm, job = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    assert VM.objects.get(pk=vm.pk).state == "running", Job.objects.get(pk=job.pk).error_message

    page = login("alice", "alice-pass-1")
    page.goto(f"/vms/{vm.pk}/")
    page.once("dialog", lambda dialog: dialog.accept())  # data-confirm asks before the shutdown
    page.fill("#capture-form input[name=image_name]", "alice-course-work")
    page.fill("#capture-form input[name=comment]", "before the exam")
    page.click("#capture-button")
    capture = Job.objects.get(opcode="vm.capture")
    expect(page.locator("#capture #job-status")).to_have_text("queued")
    page.wait_for_selector("html[data-live=subscribed]", state="attached")

    sync_jobs.drain()  # the worker's part, in this process: the page hears it over the websocket
    assert Job.objects.get(pk=capture.pk).status == "success"
    link = page.locator("#captured-image a").first
    expect(link).to_have_text("alice-course-work", timeout=15000)  # the page reloaded on the end
    link.click()
    expect(page.locator("h1")).to_contain_text("alice-course-work")

    new = Image.objects.get(name="alice-course-work")
    assert new.owner == alice and new.revisions.get().comment == "before the exam"
    page.goto("/vms/images/")
    expect(page.locator("#my-images")).to_contain_text("alice-course-work")
    assert not services.visible_images(bob).filter(pk=new.pk).exists()
