"""Direct kernel boot as an image option: a variant's kernel, initrd and command line through
the service, the API, the admin's form and the CLI; a VM built and captured on libvirt."""

import hashlib
import xml.etree.ElementTree as ET
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from drivers import registry as drivers
from jobs.models import Job
from provisioning import services
from provisioning.admin import ImageVariantInlineForm
from provisioning.models import VM, Image, ImageVariant
from tests.provisioning.test_libvirt import kvm_host  # noqa: F401 (fixture)

ARGS = "console=ttyS0 quiet"


@pytest.fixture
def boot_files(tmp_path):
    files = {}
    for name in ("disk.qcow2", "vmlinux", "initrd"):
        (tmp_path / name).write_bytes(f"{name} bytes\n".encode())
        files[name] = str(tmp_path / name)
    return files


def kernel_fields(files):
    return {"kernel": files["vmlinux"], "initrd": files["initrd"], "kernel_args": ARGS}


@pytest.fixture
def blank(db):
    return services.create_image(actor="test", name="guest", min_memory_mib=128, default_memory_mib=256)


def add(image, files, **fields):
    values = {"hypervisor_type": "kvm", "format": "qcow2", "location": files["disk.qcow2"], **kernel_fields(files)}
    return services.add_variant(image, actor="test", **{**values, **fields})


def test_a_variant_keeps_its_kernel_initrd_and_command_line(blank, boot_files):
    variant = add(blank, boot_files)

    variant.refresh_from_db()
    assert (variant.kernel, variant.initrd, variant.kernel_args) == (boot_files["vmlinux"], boot_files["initrd"], ARGS)
    spec = services.spec(variant)
    assert (spec.kernel, spec.initrd, spec.kernel_args) == (variant.kernel, variant.initrd, ARGS)


@pytest.mark.parametrize(
    ("fields", "field", "complaint"),
    [
        ({"kernel_args": "quiet\nroot=/dev/sda"}, "kernel_args", "one line"),
        ({"kernel_args": "x" * 1025}, "kernel_args", "1024"),
        ({"kernel": ""}, "kernel", "without a kernel"),
        ({"hypervisor_type": "vmware", "format": "vmdk"}, "kernel", "cannot boot a kernel directly"),
        ({"checksum": "sha256:" + "ab" * 32}, "kernel_checksum", "needs one"),
        ({"kernel": "http://10.9.9.9/vmlinux"}, "kernel", "not allowed"),
    ],
)
def test_bad_kernel_settings_are_refused_on_their_field(blank, boot_files, fields, field, complaint):
    with pytest.raises(ValidationError) as caught:
        add(blank, boot_files, **fields)

    assert complaint in " ".join(caught.value.message_dict.get(field, [])), caught.value.message_dict
    assert not blank.variants.exists()


def test_the_api_takes_and_shows_the_kernel_settings(api, admin_user, blank, boot_files):
    body = {"image": blank.pk, "hypervisor_type": "kvm", "format": "qcow2", "location": boot_files["disk.qcow2"]}
    response = api(admin_user).post("/api/v1/image-variants/", {**body, **kernel_fields(boot_files)}, format="json")
    assert response.status_code == 201, response.json()

    shown = api(admin_user).get(f"/api/v1/image-variants/{response.json()['id']}/").json()
    assert (shown["kernel"], shown["initrd"], shown["kernel_args"]) == (
        boot_files["vmlinux"],
        boot_files["initrd"],
        ARGS,
    )
    refused = api(admin_user).post(
        "/api/v1/image-variants/",
        {**body, "hypervisor_type": "vmware", "format": "vmdk", "kernel": boot_files["vmlinux"]},
        format="json",
    )
    assert refused.status_code == 400 and "kernel" in refused.json()["error"]["fields"]


def test_a_revision_made_through_the_api_takes_the_kernel_settings(api, admin_user, blank, boot_files):
    disk = {"hypervisor_type": "kvm", "format": "qcow2", "location": boot_files["disk.qcow2"]}
    body = {"image": blank.pk, "disks": [{**disk, **kernel_fields(boot_files)}]}
    response = api(admin_user).post("/api/v1/image-revisions/", body, format="json")
    assert response.status_code == 201, response.json()

    added = blank.revisions.get().variants.get()
    assert (added.kernel, added.initrd, added.kernel_args) == (boot_files["vmlinux"], boot_files["initrd"], ARGS)


def test_the_admin_form_refuses_a_kernel_for_vmware(blank, boot_files):
    data = {"hypervisor_type": "vmware", "format": "vmdk", "location": "tmpl", "size_gib": 0, "kernel": "/k"}
    form = ImageVariantInlineForm(data=data, instance=ImageVariant(image=blank))
    assert not form.is_valid() and "cannot boot a kernel" in str(form.errors["kernel"])
    form = ImageVariantInlineForm(
        data={**data, "hypervisor_type": "kvm", "format": "qcow2"}, instance=ImageVariant(image=blank)
    )
    assert form.is_valid(), form.errors


def test_the_cli_adds_a_revision_that_boots_a_kernel(blank, boot_files):
    out = StringIO()
    variant = f"kvm,qcow2,{boot_files['disk.qcow2']}"
    call_command(
        "revision",
        "add",
        "guest",
        "--variant",
        variant,
        "--kernel",
        boot_files["vmlinux"],
        "--initrd",
        boot_files["initrd"],
        "--kernel-args",
        ARGS,
        stdout=out,
    )
    added = blank.revisions.get().variants.get()
    assert (added.kernel, added.initrd, added.kernel_args) == (boot_files["vmlinux"], boot_files["initrd"], ARGS)


def test_a_vm_boots_its_images_kernel_on_libvirt_and_its_capture_keeps_it(
    kvm_host,  # noqa: F811
    admin_user,
    sync_jobs,
    boot_files,
):
    image = services.create_image(actor="test", name="guest", min_memory_mib=128, default_memory_mib=256)
    add(image, boot_files, checksum=_sha(boot_files["disk.qcow2"]), **_sums(boot_files))
    vm, job = services.request_vm(actor=admin_user, owner=admin_user, image=image)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
    driver = drivers.driver_for(kvm_host)
    os_ = ET.fromstring(driver.conn.lookupByName(VM.objects.get(pk=vm.pk).key).XMLDesc(0)).find("os")
    assert ".kernel-" in os_.findtext("kernel") and os_.findtext("cmdline") == ARGS

    job = services.submit_action(VM.objects.get(pk=vm.pk), "capture", actor=admin_user, image_name="guest-custom")
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
    captured = Image.objects.get(name="guest-custom").variants.get()
    assert captured.kernel.endswith("/guest-custom.kernel") and captured.initrd.endswith("/guest-custom.initrd")
    assert captured.kernel_args == ARGS
    again, job = services.request_vm(actor=admin_user, owner=admin_user, image=captured.image)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message


def _sha(path):
    with open(path, "rb") as handle:
        return "sha256:" + hashlib.sha256(handle.read()).hexdigest()


def _sums(files):
    return {"kernel_checksum": _sha(files["vmlinux"]), "initrd_checksum": _sha(files["initrd"])}
