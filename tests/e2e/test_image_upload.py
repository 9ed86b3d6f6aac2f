"""Bring your own image in a real browser: the page sends the disk in chunks (tus), the check job
accepts it, and the page links the user's new image; a disk with a backing file is refused with
its reason."""

import pytest
from django.conf import settings
from playwright.sync_api import expect

from provisioning.models import Image, ImageUpload
from tests.jobs.conftest import sync_jobs  # noqa: F401 (fixture)
from tests.jobs.helpers import wait_until
from tests.provisioning.test_disks import qcow2

pytestmark = pytest.mark.slow


def upload(page, path, name):
    page.goto("/vms/images/")
    page.fill("#upload-form input[name=name]", name)
    page.select_option("#upload-form select[name=format]", "qcow2")
    page.set_input_files("#upload-form input[name=file]", str(path))
    page.click("#upload-form button[type=submit]")
    return wait_until(
        lambda: ImageUpload.objects.filter(name=name, state="checking").first(), 30, f"{name} received", None
    )


def test_a_user_uploads_a_qcow2_and_gets_their_image_and_a_bad_one_is_refused(
    alice,
    bob,
    login,
    tmp_path,
    upload_stores,
    sync_jobs,  # noqa: F811
):
    page = login("alice", "alice-pass-1")
    upload(page, qcow2(tmp_path / "mine.qcow2"), "alice-disk")
    sync_jobs.drain()  # the check job, in this process; the page polls the upload's state
    status = page.locator("#upload-status")
    expect(status).to_contain_text("is ready", timeout=15000)
    new = Image.objects.get(name="alice-disk")
    assert new.owner == alice and not Image.objects.visible_to(bob).filter(pk=new.pk).exists()
    status.locator("a").click()
    expect(page.locator("h1")).to_contain_text("alice-disk")

    upload(page, qcow2(tmp_path / "evil.qcow2", "64M", "-b", "/etc/passwd", "-F", "raw"), "evil-disk")
    sync_jobs.drain()
    expect(status).to_contain_text("Refused", timeout=15000)
    expect(status).to_contain_text("backing file")
    assert not Image.objects.filter(name="evil-disk").exists()
    assert not list(settings.IMAGE_UPLOAD_DIR.iterdir())  # nothing of it left
