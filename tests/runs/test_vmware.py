"""A batch run on a vcsim-backed host (driver vmware), as far as vcsim's guest operations go.

Debian's vcsim runs guest operations only in a container engine, which this machine has not:
every file transfer answers GuestOperationsUnavailable. So a run there is built, fails at its
first guest call with that reason, and leaves nothing behind; the image's guest password is
never in a message, the change log, an event, the API or the log.
"""

import logging

import pytest

from capacity.models import Allocation
from core.models import Event, ObjectChange
from drivers import registry as drivers
from provisioning import services as vms
from provisioning.models import VM
from tests.runs.helpers import fresh, submit
from tests.vcsim import cluster_host, vmdk_image

pytestmark = pytest.mark.slow
GUEST_PASSWORD = "svc-guest-secret-91c2"  # noqa: S105 (made up here)


@pytest.fixture
def esx_host(vcsim, make_host, settings):
    return cluster_host(vcsim, make_host, settings, "10.99.0.9")


def vmware_image(tmp_path, **guest):
    return vmdk_image(tmp_path, f"debian-vmware-{tmp_path.name}"[:60], platform="debian-vmware", variant=guest)


def assert_nothing_left(run, host):
    run = fresh(run)
    assert run.vm_id is not None and run.vm.state == VM.State.DESTROYED
    assert drivers.driver_for(host).state(run.vm.key) == "absent"
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_run_on_vcsim_fails_at_its_first_guest_operation_and_leaves_nothing(
    esx_host, alice, admin_user, api, sync_jobs, tmp_path, caplog
):
    image = vmware_image(tmp_path, guest_username="vclmgr-svc", guest_password=GUEST_PASSWORD)
    caplog.set_level(logging.DEBUG)

    run = submit(alice, image=image, platform="", argv=["make", "test"])
    sync_jobs.drain()

    run = fresh(run)
    assert run.state == "error"
    assert f"VMware Tools on VM {run.vm.key} do not offer guest operations (are Tools running?)" in run.error
    assert run.started is None  # its command never started
    assert_nothing_left(run, esx_host)
    # The guest password: encrypted at rest, and nowhere else.
    variant = image.variants.get()
    assert variant.encrypted_guest_password and GUEST_PASSWORD not in variant.encrypted_guest_password
    assert variant.guest_login() == {"username": "vclmgr-svc", "password": GUEST_PASSWORD}
    shown = api(admin_user).get(f"/api/v1/image-variants/{variant.pk}/")
    assert shown.status_code == 200 and shown.json()["has_guest_password"] is True
    assert shown.json()["guest_username"] == "vclmgr-svc" and GUEST_PASSWORD not in shown.content.decode()
    assert GUEST_PASSWORD not in repr(list(ObjectChange.objects.values()))
    assert GUEST_PASSWORD not in repr(list(Event.objects.values()))
    assert GUEST_PASSWORD not in repr(fresh(run).__dict__) and GUEST_PASSWORD not in caplog.text


def test_a_run_whose_image_has_no_guest_login_is_refused_before_any_guest_call(esx_host, alice, sync_jobs, tmp_path):
    image = vmware_image(tmp_path)

    run = submit(alice, image=image, platform="", argv=["make", "test"])
    sync_jobs.drain()

    run = fresh(run)
    assert run.state == "error" and "its image has none" in run.error and "guest user and password" in run.error
    assert_nothing_left(run, esx_host)


def test_a_guest_login_needs_both_user_and_password(esx_host, tmp_path, admin_user, api):
    from django.core.exceptions import ValidationError

    image = vmware_image(tmp_path)
    with pytest.raises(ValidationError, match="both a user and a password"):
        vms.add_variant(
            image, actor="test", hypervisor_type="sim", format="sim", location="sim://x", guest_username="svc"
        )
    refused = api(admin_user).post(
        "/api/v1/image-variants/",
        {
            "image": image.pk,
            "hypervisor_type": "sim",
            "format": "sim",
            "location": "sim://x",
            "guest_password": "p",
        },
        format="json",
    )
    assert refused.status_code == 400 and "guest_username" in refused.json()["error"]["fields"]
