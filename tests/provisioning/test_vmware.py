"""The VM lifecycle on a vcsim-backed hypervisor (driver vmware), jobs run in this process."""

import pytest

from capacity.models import Allocation
from drivers import registry as drivers
from jobs.models import Job
from provisioning import services
from provisioning.models import VM, Image
from tests.vcsim import cluster_host
from tests.vcsim import vmdk_image as vcsim_image

pytestmark = pytest.mark.slow
GUEST_ADDRESS = "10.99.0.8"


@pytest.fixture
def esx_host(vcsim, make_host, settings):
    return cluster_host(vcsim, make_host, settings, GUEST_ADDRESS)


@pytest.fixture
def vmdk_image(tmp_path):
    return vcsim_image(tmp_path, "ubuntu-vmware")


def run(job, sync_jobs):
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "success", job.error_message
    return job


def act(vm, action, sync_jobs, **params):
    return run(services.submit_action(VM.objects.get(pk=vm.pk), action, actor="test", **params), sync_jobs)


def test_the_lifecycle_on_vcsim(esx_host, vmdk_image, admin_user, sync_jobs, tmp_path):
    vm, job = services.request_vm(actor=admin_user, owner=admin_user, image=vmdk_image)
    run(job, sync_jobs)
    vm = VM.objects.get(pk=vm.pk)
    driver = drivers.driver_for(esx_host)
    try:
        assert vm.state == "running" and vm.host == esx_host and vm.address == GUEST_ADDRESS
        assert driver.state(vm.key) == "running"
        act(vm, "snapshot", sync_jobs, name="clean")
        act(vm, "stop", sync_jobs, force=True)
        assert driver.state(vm.key) == "stopped"
        act(vm, "revert", sync_jobs, name="clean")
        # vSphere snapshots are taken without memory here: the VM comes back stopped, and the row says so.
        assert VM.objects.get(pk=vm.pk).state == driver.state(vm.key) == "stopped"
        act(vm, "start", sync_jobs)
        assert VM.objects.get(pk=vm.pk).address == GUEST_ADDRESS
        act(vm, "stop", sync_jobs)
        template = f"captured-{tmp_path.name}"[:100]
        job = act(vm, "capture", sync_jobs, image_name=template)
        captured = Image.objects.get(pk=job.result["image"])
        variant = captured.variants.get()
        assert captured.parent == vmdk_image and (variant.format, variant.location) == ("template", template)
        assert variant.hypervisor_type == "vmware" and driver._find(template) is not None
        act(vm, "destroy", sync_jobs)
        assert driver.state(vm.key) == "absent" and VM.objects.get(pk=vm.pk).state == "destroyed"
        # The captured template boots a new VM (a clone), which is destroyed in turn.
        clone, job = services.request_vm(actor=admin_user, owner=admin_user, image=captured)
        run(job, sync_jobs)
        assert driver.state(clone.key) == "running" and VM.objects.get(pk=clone.pk).variant == variant
        act(clone, "destroy", sync_jobs)
        assert driver.state(clone.key) == "absent"
        assert not Allocation.objects.filter(released__isnull=True).exists()
    finally:
        for made in VM.objects.all():
            driver.destroy(made.key)


def test_a_windows_reservation_on_vcsim_gets_cloudbase_inits_guestinfo(esx_host, tmp_path, alice, sync_jobs, caplog):
    import io
    import json
    import logging
    from datetime import timedelta

    import yaml
    from django.core.management import call_command

    from core.models import Event
    from drivers.vmware import guestinfo
    from reservations import services as reservations
    from reservations.models import Reservation

    image = vcsim_image(tmp_path, "win-vmware", os="Windows Server 2022")
    driver = drivers.driver_for(esx_host)
    caplog.set_level(logging.DEBUG)
    reservation = reservations.reserve(alice, image, actor=alice, duration=timedelta(hours=1))
    sync_jobs.drain()
    reservation = Reservation.objects.get(pk=reservation.pk)
    try:
        assert reservation.status == "ready", reservation.error
        password, key = reservation.get_password(), reservation.vm.key
        extra = driver._extra(driver._vm(key))
        # What cloudbase-init's VMwareGuestInfoService reads: the same keys and encodings as cloud-init's.
        user = yaml.safe_load(guestinfo.decode(extra["guestinfo.userdata"], extra["guestinfo.userdata.encoding"]))
        meta = json.loads(guestinfo.decode(extra["guestinfo.metadata"], extra["guestinfo.metadata.encoding"]))
        assert user["set_hostname"] == meta["local-hostname"] == key
        assert user["users"] == [
            {"name": "alice", "groups": ["Administrators", "Remote Desktop Users"], "passwd": password}
        ]
        listing = io.StringIO()
        call_command("vm", "list", stdout=listing)
        assert key in listing.getvalue() and password not in listing.getvalue()
        assert password not in repr(driver.list_vms()) and password not in repr(driver._info(driver._vm(key)))
        assert not [event for event in Event.objects.all() if password in str(event.data)]
        assert not [job for job in Job.objects.all() if password in str(job.steps) + str(job.result)]
        assert password not in caplog.text
        reservations.end(reservation, actor=alice)
        sync_jobs.drain()
        # The password leaves the host with the VM (or with its seed, for a VM kept for reuse).
        assert driver.state(key) == "absent" or not driver._extra(driver._vm(key)).get("guestinfo.userdata")
    finally:
        for made in VM.objects.all():
            driver.destroy(made.key)
