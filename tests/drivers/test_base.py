"""The plain data of the driver API and the registry (no hypervisor needed)."""

import dataclasses
import pickle

import pytest

from drivers import registry
from drivers.base import (
    Conflict,
    DriverError,
    ImageVariantSpec,
    Invalid,
    NotFound,
    Unreachable,
    VMSpec,
    parse_checksum,
    staged_name,
    vm_key,
)
from tests import processes

IMAGE = ImageVariantSpec("ubuntu-24.04", "qcow2", "/images/ubuntu.qcow2", "sha256:" + "ab" * 32, 8)


def test_vm_keys_derive_from_the_database_id():
    assert vm_key(42) == "vcl-42"
    VMSpec(vm_key(42), 1, 512, 1, IMAGE).validate()


def test_the_fingerprint_tells_a_retry_from_a_stranger():
    spec = VMSpec("vcl-1", 2, 2048, 20, IMAGE)

    assert spec.fingerprint() == VMSpec("vcl-1", 2, 2048, 20, IMAGE).fingerprint()
    assert spec.fingerprint() != dataclasses.replace(spec, memory_mib=4096).fingerprint()
    assert spec.fingerprint() != dataclasses.replace(spec, key="vcl-2").fingerprint()


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (dataclasses.replace(IMAGE, name="a/b"), "image name"),
        (dataclasses.replace(IMAGE, format="iso"), "format"),
        (dataclasses.replace(IMAGE, location=""), "location"),
        (dataclasses.replace(IMAGE, checksum="md5"), "checksum"),
        (dataclasses.replace(IMAGE, size_gib=-1), "size_gib"),
    ],
)
def test_bad_images_are_invalid(image, message):
    with pytest.raises(Invalid, match=message):
        image.validate()


def test_checksums_name_their_algorithm():
    assert parse_checksum("SHA512:" + "0" * 128) == ("sha512", "0" * 128)
    assert parse_checksum("ab" * 32) == ("sha256", "ab" * 32)
    assert staged_name(IMAGE, ".qcow2") == "ubuntu-24.04-abababababab.qcow2"


def test_errors_say_whether_a_retry_helps_and_survive_pickling():
    assert (DriverError("x").permanent, Unreachable("x").permanent, NotFound("x").permanent) == (True, False, True)
    flagged = Unreachable("bad password", permanent=True)

    copy = pickle.loads(pickle.dumps(flagged))

    assert (type(copy), str(copy), copy.permanent) == (Unreachable, "bad password", True)
    assert issubclass(Conflict, DriverError)


def test_the_registry_builds_drivers_by_kind():
    driver = registry.get_driver("sim", "sim://host-1", options={"delay": 0})

    assert (driver.kind, driver.host_name, driver.options) == ("sim", "host-1", {"delay": 0})
    with pytest.raises(Invalid, match="unknown driver"):
        registry.get_driver("xen", "xen:///")
    with pytest.raises(Invalid, match="sim URI"):
        registry.get_driver("sim", "http://host-1")
    with pytest.raises(Invalid, match="vSphere URL"):
        registry.get_driver("vmware", "vcenter.example.org")


@pytest.mark.slow
def test_libvirt_and_pyvmomi_load_only_when_used():
    code = (
        "import sys, django; django.setup()\n"
        "from drivers import registry\n"
        "registry.get_driver('sim', 'sim://a')\n"
        "print(sorted(m for m in ('libvirt', 'pyVmomi') if m in sys.modules))\n"
        "registry.get_driver('libvirt', 'test:///default')\n"
        "registry.get_driver('vmware', 'https://vcenter.example.org/sdk')\n"
        "print(sorted(m for m in ('libvirt', 'pyVmomi') if m in sys.modules))\n"
    )
    child = processes.run_python(code)

    assert child.returncode == 0, child.stderr
    assert child.stdout.splitlines() == ["[]", "['libvirt', 'pyVmomi']"]
