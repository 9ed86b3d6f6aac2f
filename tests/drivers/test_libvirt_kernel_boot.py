"""Direct kernel boot on the libvirt driver: staging, the domain definition, capture, moves
(libvirt's test driver), and the definition checked against libvirt's own schema."""

import dataclasses
import hashlib
import xml.etree.ElementTree as ET

import pytest

from drivers.base import Invalid, NotFound, VMState
from drivers.libvirt import domxml
from tests.drivers.conftest import valid_for_libvirt

ARGS = "console=ttyS0 quiet root=/dev/vda1"


def with_kernel(image, tmp_path, *, initrd=True, kernel_content=b"kernel\n"):
    kernel = tmp_path / "vmlinux"
    kernel.write_bytes(kernel_content)
    fields = {"kernel": str(kernel), "kernel_args": ARGS, "kernel_checksum": _sha(kernel_content)}
    if initrd:
        (tmp_path / "initrd").write_bytes(b"initrd\n")
        fields.update(initrd=str(tmp_path / "initrd"), initrd_checksum=_sha(b"initrd\n"))
    return dataclasses.replace(image, **fields)


def _sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def names(driver):
    return sorted(vol.name() for vol in driver._pool().listAllVolumes())


def os_of(driver, key):
    return ET.fromstring(driver.conn.lookupByName(key).XMLDesc(0)).find("os")


@pytest.fixture
def kimage(libvirt_peer, tmp_path):
    return with_kernel(libvirt_peer.image, tmp_path)


def test_the_domain_boots_the_kernel_instead_of_the_disk(libvirt_peer):
    spec = libvirt_peer.spec()
    booted = domxml.domain_xml(
        spec, domain_type="kvm", disk_path="/p/d.qcow2", kernel="/p/k", initrd="/p/i", cmdline="console=ttyS0"
    )
    os_ = ET.fromstring(booted).find("os")
    assert [(e.tag, e.text) for e in os_][1:] == [("kernel", "/p/k"), ("initrd", "/p/i"), ("cmdline", "console=ttyS0")]
    assert os_.find("boot") is None
    assert domxml.kernel_boot(booted) == {"kernel": "/p/k", "initrd": "/p/i", "cmdline": "console=ttyS0"}
    plain = domxml.domain_xml(spec, domain_type="kvm", disk_path="/p/d.qcow2")
    assert ET.fromstring(plain).find("os/boot").get("dev") == "hd" and domxml.kernel_boot(plain) == {}
    moved = domxml.repathed(booted, {"/p/k": "/q/k", "/p/i": "/q/i", "/p/d.qcow2": "/q/d.qcow2"})
    assert domxml.kernel_boot(moved)["kernel"] == "/q/k" and domxml.kernel_boot(moved)["initrd"] == "/q/i"


@pytest.mark.parametrize("kernel", [None, "/var/lib/libvirt/images/g.qcow2.kernel-0123456789ab"])
def test_the_definition_is_valid_for_libvirts_schema(libvirt_peer, tmp_path, kernel):
    spec = libvirt_peer.spec()
    xml = domxml.domain_xml(
        spec,
        domain_type="qemu",
        disk_path="/var/lib/libvirt/images/vcl-1.qcow2",
        kernel=kernel,
        initrd=kernel and kernel.replace("kernel", "initrd"),
        cmdline=ARGS if kernel else "",
    )
    valid_for_libvirt(tmp_path, xml, "domain")


def test_staging_puts_kernel_and_initrd_beside_the_disk_once_and_unstaging_removes_them(libvirt_peer, kimage):
    driver = libvirt_peer.source
    before = names(driver)
    path = driver.stage_image(kimage)
    staged = sorted(set(names(driver)) - set(before))
    disk = path.rsplit("/", 1)[1]
    assert [n.replace(disk, "D")[:9] for n in staged] == ["D", "D.initrd-", "D.kernel-"]
    assert driver.stage_image(kimage) == path and sorted(set(names(driver)) - set(before)) == staged

    assert driver.unstage_image(path)
    assert names(driver) == before


def test_a_kernel_that_does_not_match_its_checksum_is_not_staged(libvirt_peer, kimage):
    bad = dataclasses.replace(kimage, kernel_checksum=_sha(b"another kernel\n"))
    before = names(libvirt_peer.source)

    with pytest.raises(Invalid, match="checksum mismatch"):
        libvirt_peer.source.stage_image(bad)

    assert names(libvirt_peer.source) == before  # no disk either: a staged disk means a whole image


def test_a_vm_boots_the_staged_kernel_with_its_arguments(libvirt_peer, kimage):
    driver = libvirt_peer.source
    driver.stage_image(kimage)
    spec = libvirt_peer.spec(image=kimage)

    driver.create(spec)
    driver.start(spec.key)

    os_ = os_of(driver, spec.key)
    kernel = driver.conn.storageVolLookupByPath(os_.findtext("kernel"))
    assert kernel.name().startswith(f"{kimage.name}-") and ".kernel-" in kernel.name()
    assert ".initrd-" in os_.findtext("initrd") and os_.findtext("cmdline") == ARGS
    assert driver.state(spec.key) == VMState.RUNNING
    assert driver.create(spec).key == spec.key  # a retried create adopts it


def test_the_kernel_is_optional_without_an_initrd(libvirt_peer, tmp_path):
    image = with_kernel(libvirt_peer.image, tmp_path, initrd=False)
    libvirt_peer.source.stage_image(image)
    spec = libvirt_peer.spec(image=image)

    libvirt_peer.source.create(spec)

    os_ = os_of(libvirt_peer.source, spec.key)
    assert os_.findtext("kernel") and os_.find("initrd") is None


def test_a_vm_is_not_made_while_its_kernel_is_not_staged(libvirt_peer, kimage, tmp_path):
    libvirt_peer.source.stage_image(kimage)
    other = tmp_path / "other"
    other.mkdir()
    newer = with_kernel(libvirt_peer.image, other, kernel_content=b"a newer kernel\n")  # same disk

    with pytest.raises(NotFound, match="kernel of image"):
        libvirt_peer.source.create(libvirt_peer.spec(image=newer))


def test_a_capture_keeps_the_kernel_settings(libvirt_peer, kimage):
    driver = libvirt_peer.source
    driver.stage_image(kimage)
    spec = libvirt_peer.spec(image=kimage)
    driver.create(spec)

    captured = driver.capture(spec.key, "derived")

    assert captured.kernel.endswith("/derived.kernel") and captured.initrd.endswith("/derived.initrd")
    assert captured.kernel_args == ARGS and captured.location.endswith("/derived.qcow2")
    captured.validate()
    # It boots on the same host from those copies, which are volumes of the host already.
    path = driver.stage_image(captured)
    assert path == captured.location
    again = libvirt_peer.spec(image=captured)
    driver.create(again)
    assert os_of(driver, again.key).findtext("kernel") == captured.kernel
    assert driver.capture(spec.key, "derived") == captured  # a retried capture finds its copies


def test_a_disk_booted_vm_captures_without_kernel_settings(libvirt_peer):
    libvirt_peer.source.stage_image(libvirt_peer.image)
    spec = libvirt_peer.spec()
    libvirt_peer.source.create(spec)

    captured = libvirt_peer.source.capture(spec.key, "plain")

    assert (captured.kernel, captured.initrd, captured.kernel_args) == ("", "", "")


def test_a_migration_names_the_targets_kernel(libvirt_peer, kimage):
    libvirt_peer.source.stage_image(kimage)
    spec = libvirt_peer.spec(image=kimage)
    libvirt_peer.source.create(spec)
    libvirt_peer.source.start(spec.key)

    with pytest.raises(NotFound, match="not staged on"):  # the target has not got the kernel yet
        libvirt_peer.source.migrate(spec.key, libvirt_peer.target)

    libvirt_peer.target.stage_image(kimage)
    libvirt_peer.source.migrate(spec.key, libvirt_peer.target)

    os_ = os_of(libvirt_peer.target, spec.key)
    target_names = names(libvirt_peer.target)
    for role in ("kernel", "initrd"):
        vol = libvirt_peer.target.conn.storageVolLookupByPath(os_.findtext(role))
        assert vol.name() in target_names
    assert libvirt_peer.target.state(spec.key) == VMState.RUNNING


def test_a_disk_with_a_checksum_needs_checksummed_boot_files(libvirt_peer, kimage):
    with pytest.raises(Invalid, match="kernel_checksum"):
        dataclasses.replace(kimage, kernel_checksum="").validate()
    with pytest.raises(Invalid, match="initrd_checksum"):
        dataclasses.replace(kimage, initrd_checksum="").validate()
    dataclasses.replace(kimage, checksum="", kernel_checksum="", initrd_checksum="").validate()
