"""The VM lifecycle on a vcsim-backed hypervisor (driver vmware), jobs run in this process."""

import hashlib

import pytest

from capacity.models import Allocation
from drivers import registry as drivers
from inventory import services as inventory
from jobs.models import Job
from provisioning import services
from provisioning.models import VM, Image
from tests.vcsim import VCSIM_PASSWORD, VCSIM_USER

pytestmark = pytest.mark.slow
GUEST_ADDRESS = "10.99.0.8"


@pytest.fixture
def esx_host(vcsim, make_host, settings):  # noqa: F811
    # vcsim has no VMware Tools: this advanced setting is how it lets a test play the guest reporting its address.
    settings.VCLMGR_DRIVER_OPTIONS = {"vmware": {"extra_config": {"SET.guest.ipAddress": GUEST_ADDRESS}}}
    credential = inventory.create_credential(
        actor="test", name="vcsim", username=VCSIM_USER, secret=VCSIM_PASSWORD, endpoints=[vcsim.url]
    )
    name = next(host["name"] for host in vcsim.hosts if "_C" in host["name"])
    return make_host(
        name,
        driver="vmware",
        uri=f"{vcsim.url}?host={name}",
        credential=credential,
        cpus=16,
        memory_mib=32768,
        disk_gib=200,
    )


@pytest.fixture
def vmdk_image(tmp_path):
    # vcsim lives for the whole session: content unique to this test, like the driver tests.
    content = f"vmdk of {tmp_path.name}\n".encode()
    path = tmp_path / "ubuntu.vmdk"
    path.write_bytes(content)
    image = services.create_image(
        actor="test", name="ubuntu-vmware", min_memory_mib=256, default_memory_mib=512, default_disk_gib=10
    )
    services.add_variant(
        image,
        actor="test",
        hypervisor_type="vmware",
        format="vmdk",
        location=str(path),
        checksum="sha256:" + hashlib.sha256(content).hexdigest(),
        size_gib=1,
    )
    return image


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

    content = f"windows vmdk of {tmp_path.name}\n".encode()
    path = tmp_path / "win.vmdk"
    path.write_bytes(content)
    image = services.create_image(
        actor="test",
        name="win-vmware",
        os="Windows Server 2022",
        min_memory_mib=256,
        default_memory_mib=512,
        default_disk_gib=10,
    )
    services.add_variant(
        image,
        actor="test",
        hypervisor_type="vmware",
        format="vmdk",
        location=str(path),
        checksum="sha256:" + hashlib.sha256(content).hexdigest(),
        size_gib=1,
    )
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
