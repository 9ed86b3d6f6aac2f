"""Capture from the VM and reservation pages: who gets the form, what a POST submits, the result."""

from datetime import timedelta

import pytest

from accounts import access
from jobs.models import Job
from provisioning import services
from provisioning.models import Image
from reservations import services as reservations
from tests.provisioning.test_pages import page, running_vm  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def auditor(django_user_model):
    user = django_user_model.objects.create_user("audrey")
    access.set_roles(user, ["auditor"], actor="test")
    return user


def test_the_vm_page_offers_capture_to_its_owner_and_staff_only(client, running_vm, alice, admin_user, auditor):  # noqa: F811
    assert 'id="capture-form"' in page(client, alice, f"/vms/{running_vm.pk}/")
    assert 'id="capture-form"' in page(client, admin_user, f"/vms/{running_vm.pk}/")
    seen = page(client, auditor, f"/vms/{running_vm.pk}/")  # an auditor sees the VM, may not capture it
    assert running_vm.key in seen and 'id="capture-form"' not in seen


def test_a_post_submits_the_capture_and_the_page_follows_it_to_the_new_image(client, running_vm, alice, sync_jobs):  # noqa: F811
    client.force_login(alice)
    url = f"/vms/{running_vm.pk}/capture/"
    response = client.post(url, {"image_name": "my-lab", "comment": "tools in", "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == f"/vms/{running_vm.pk}/"  # not elsewhere
    job = Job.objects.get(opcode="vm.capture")
    assert job.params == {"vm": running_vm.pk, "image_name": "my-lab", "force": False, "comment": "tools in"}
    assert job.submitter == alice
    shown = page(client, alice, f"/vms/{running_vm.pk}/")
    assert f'data-id="{job.pk}"' in shown and "js/pages/job_progress.js" in shown and 'id="job-progress"' in shown
    sync_jobs.drain()
    new = Image.objects.get(name="my-lab")
    shown = page(client, alice, f"/vms/{running_vm.pk}/")
    assert f'href="/vms/images/{new.pk}/"' in shown and f"?image={new.pk}" in shown


@pytest.mark.parametrize(
    "data, message",
    [({"image_name": "debian-12"}, "exists already"), ({"image_name": "two words"}, "image_name")],
)
def test_a_bad_name_is_refused_and_submits_nothing(client, running_vm, alice, data, message):  # noqa: F811
    client.force_login(alice)
    response = client.post(f"/vms/{running_vm.pk}/capture/", data, follow=True)
    assert message in response.content.decode()
    assert not Job.objects.filter(opcode="vm.capture").exists()


def test_nobody_captures_another_users_vm(client, running_vm, bob, auditor):  # noqa: F811
    for user in (bob, auditor):
        client.force_login(user)
        assert client.post(f"/vms/{running_vm.pk}/capture/", {"image_name": "stolen"}).status_code == 404
    assert not Job.objects.filter(opcode="vm.capture").exists()


def test_the_reservation_page_offers_capture_to_its_user(client, sim_host, image, alice, bob, admin_user, sync_jobs):
    reservation = reservations.reserve(alice, image, actor=alice, duration=timedelta(hours=1))
    sync_jobs.drain()
    reservation.refresh_from_db()
    assert reservation.status == "ready", reservation.error
    url = f"/reservations/{reservation.pk}/"
    shown = page(client, alice, url)
    assert f'action="/vms/{reservation.vm_id}/capture/"' in shown and f'value="{url}"' in shown
    assert 'id="capture-form"' not in page(client, bob, url, status=404)
    client.force_login(alice)
    response = client.post(f"/vms/{reservation.vm_id}/capture/", {"image_name": "from-seat", "next": url})
    assert response.status_code == 302 and response["Location"] == url
    sync_jobs.drain()
    assert Image.objects.get(name="from-seat").owner == alice
    assert "from-seat" in page(client, alice, url)


def test_a_vm_that_cannot_be_captured_shows_no_form(client, running_vm, alice, sync_jobs):  # noqa: F811
    services.submit_action(running_vm, "destroy", actor=alice)
    sync_jobs.drain()
    assert 'id="capture"' not in page(client, alice, f"/vms/{running_vm.pk}/")  # no form, no capture to follow
