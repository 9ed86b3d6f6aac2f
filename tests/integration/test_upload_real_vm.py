"""Bring your own image on real QEMU: the test guest's disk, uploaded through the tus API in
chunks, is checked by a real worker, becomes its uploader's image, and a reservation of it boots
on the private libvirtd and lets the uploader in."""

import pytest

from provisioning import services as vms
from provisioning.models import Image
from tests.integration.test_reserve_real_vm import end_and_check_gone, kvm_host, reserve, vm_ids, wait_ready  # noqa: F401
from tests.jobs.helpers import wait_until
from tests.provisioning.test_uploads import create, patch
from tests.realvm import new_login, ssh_run

pytestmark = pytest.mark.slow
CHUNK = 4 << 20


def test_an_uploaded_qcow2_boots_and_its_uploader_logs_in(
    worker,
    api,
    alice,
    bob,
    kvm_host,  # noqa: F811 (fixture)
    guest_image,
    libvirt_conn,
    upload_stores,
):
    _host, pool = kvm_host
    data = (guest_image["dir"] / "disk.qcow2").read_bytes()
    client = api(alice)
    created = create(client, len(data), name="my-guest", fmt="qcow2")
    assert created.status_code == 201, created.content
    location = created["Location"]
    for start in range(0, len(data), CHUNK):
        assert patch(client, location, start, data[start : start + CHUNK]).status_code == 204

    def checked():
        state = client.get(location).json()
        return state if state["state"] != "checking" else None

    done = wait_until(checked, 120, "the upload's check", worker, interval=0.2)
    assert done["state"] == "done", done
    image = Image.objects.get(pk=done["image"])
    assert image.owner == alice and not Image.objects.visible_to(bob).filter(pk=image.pk).exists()
    variant = image.variants.get()
    assert (variant.hypervisor_type, variant.format) == ("kvm", "qcow2")
    vms.update_image(
        image, actor="test", min_memory_mib=128, default_memory_mib=256, min_disk_gib=0, default_disk_gib=1
    )

    user = new_login()
    rid = reserve(client, image, ssh_key=user["public"])
    details = wait_ready(client, rid, worker)["connection"]
    out = ssh_run(details["port"], details["user"], "id -un", host=details["address"], pkey=user["pkey"])
    assert out.split() == ["alice"]
    end_and_check_gone(client, rid, worker, libvirt_conn, pool)
