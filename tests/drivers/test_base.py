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
    NetworkSpec,
    NotFound,
    Unreachable,
    VMSpec,
    check_mac,
    parse_checksum,
    private_mac,
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


# --- private networks ------------------------------------------------------------------------


def lan(**overrides):
    values = {"key": "env12-lan", "cidr": "10.201.0.0/24", "hosts": (("router", "02:00:00:00:00:01"),)}
    return NetworkSpec(**{**values, **overrides})


def test_a_private_network_gives_its_members_addresses_in_order_after_the_gateway():
    spec = lan(hosts=(("router", "02:00:00:00:00:01"), ("client1", "02:00:00:00:00:02")))
    spec.validate()

    assert spec.gateway == "10.201.0.1"
    assert spec.addresses() == [
        ("router", "02:00:00:00:00:01", "10.201.0.2"),
        ("client1", "02:00:00:00:00:02", "10.201.0.3"),
    ]
    assert spec.dynamic_range() == ("10.201.0.4", "10.201.0.254")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key": "env 12"}, "network key"),
        ({"cidr": "8.8.8.0/24"}, "not a private range"),
        ({"cidr": "172.32.0.0/16"}, "not a private range"),
        ({"cidr": "10.0.0.0/8"}, "prefix"),
        ({"cidr": "10.1.2.0/30"}, "prefix"),
        ({"cidr": "10.1.2.1/24"}, "not an IPv4 network"),
        ({"cidr": "fd00::/64"}, "not an IPv4 network"),
        ({"hosts": (("Router!", "02:00:00:00:00:01"),)}, "DNS label"),
        ({"hosts": (("router", "01:00:5e:00:00:01"),)}, "multicast"),
        ({"hosts": (("router", "02:00:00:00:00:0G"),)}, "hex pairs"),
        ({"hosts": (("a", "02:00:00:00:00:01"), ("a", "02:00:00:00:00:02"))}, "hostname a given twice"),
        ({"hosts": (("a", "02:00:00:00:00:01"), ("b", "02:00:00:00:00:01"))}, "given twice"),
        ({"hosts": [("a", "02:00:00:00:00:01")]}, "tuple"),
        ({"cidr": "10.1.2.0/29", "hosts": tuple((f"h{i}", f"02:00:00:00:00:0{i}") for i in range(6))}, "do not fit"),
    ],
)
def test_it_rejects_bad_private_networks(change, message):
    with pytest.raises(Invalid, match=message) as caught:
        lan(**change).validate()

    assert caught.value.permanent


def test_a_full_small_network_has_no_dynamic_range():
    spec = lan(cidr="192.168.7.8/29", hosts=tuple((f"h{i}", f"02:00:00:00:00:0{i}") for i in range(5)))
    spec.validate()

    assert spec.addresses()[-1][2] == "192.168.7.14" and spec.dynamic_range() is None


def test_private_macs_are_stable_unicast_and_per_network():
    mac = private_mac("vcl-7", "env12-lan")

    assert mac == private_mac("vcl-7", "env12-lan") and mac.startswith("02:")
    assert mac != private_mac("vcl-7", "env12-dmz") != private_mac("vcl-8", "env12-lan")
    assert check_mac(mac, "x") == mac


def test_private_nics_change_the_fingerprint_but_no_older_vm_s():
    plain = VMSpec("vcl-1", 2, 2048, 20, IMAGE)
    joined = dataclasses.replace(plain, private_networks=(("env12-lan", private_mac("vcl-1", "env12-lan")),))

    # the value every VM made before private networks carries on its hypervisor
    assert plain.fingerprint() == "2c5d4085993a59ce4f974cae"
    assert joined.fingerprint() != plain.fingerprint()
    joined.validate()


@pytest.mark.parametrize(
    ("nics", "message"),
    [
        ((("env 12", "02:00:00:00:00:01"),), "not a network key"),
        ((("env12-lan", "02:00:00:00:00:01"), ("env12-lan", "02:00:00:00:00:02")), "network env12-lan given twice"),
        ((("a", "02:00:00:00:00:01"), ("b", "02:00:00:00:00:01")), "MAC 02:00:00:00:00:01 given twice"),
        ((("a", "03:00:00:00:00:01"),), "multicast"),
        ((("a",),), "pair"),
    ],
)
def test_it_rejects_bad_private_nics(nics, message):
    with pytest.raises(Invalid, match=message):
        VMSpec("vcl-1", 2, 2048, 20, IMAGE, private_networks=nics).validate()


def test_the_network_calls_are_fenced_in_every_driver():
    for kind in registry.KINDS:
        driver = registry.driver_class(kind)
        assert driver.supports_networks
        assert all(getattr(driver, name).fenced for name in ("create_network", "delete_network", "list_networks"))


KERNEL = {"kernel": "/boot/vmlinux", "initrd": "/boot/initrd", "kernel_args": "console=ttyS0 quiet"}
SUMS = {"kernel_checksum": "sha256:" + "cd" * 32, "initrd_checksum": "sha256:" + "ef" * 32}


def test_a_kernel_changes_the_fingerprint_but_no_disk_booted_vm_s():
    plain = VMSpec("vcl-1", 2, 2048, 20, IMAGE)
    booted = dataclasses.replace(plain, image=dataclasses.replace(IMAGE, **KERNEL, **SUMS))

    assert plain.fingerprint() == "2c5d4085993a59ce4f974cae"  # as every VM made before kernel boot
    assert booted.fingerprint() != plain.fingerprint()
    other_args = dataclasses.replace(booted.image, kernel_args="console=ttyS0")
    assert dataclasses.replace(booted, image=other_args).fingerprint() != booted.fingerprint()
    booted.validate()


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"initrd": "/boot/initrd"}, "initrd without a kernel"),
        ({"kernel_args": "quiet"}, "kernel_args without a kernel"),
        ({**KERNEL, **SUMS, "kernel_args": "quiet\nroot=/dev/sda"}, "printable text on one line"),
        ({**KERNEL, **SUMS, "kernel_args": "x" * 1025}, "at most 1024"),
        ({**KERNEL, **SUMS, "kernel": "vmlinux"}, "is not a path"),
        ({**KERNEL, **SUMS, "kernel_checksum": "md5"}, "checksum"),
        ({**KERNEL, "kernel_checksum": SUMS["kernel_checksum"]}, "needs one .initrd_checksum"),
    ],
)
def test_the_kernel_settings_are_checked(fields, complaint):
    with pytest.raises(Invalid, match=complaint):
        dataclasses.replace(IMAGE, **fields).validate()


def test_the_initrd_is_optional_and_unchecksummed_files_go_with_an_unchecksummed_disk():
    dataclasses.replace(IMAGE, kernel="/boot/vmlinux", kernel_checksum=SUMS["kernel_checksum"]).validate()
    dataclasses.replace(IMAGE, checksum="", **KERNEL).validate()
    dataclasses.replace(IMAGE, **{**KERNEL, **SUMS, "kernel_args": "x" * 1024}).validate()


def test_a_driver_that_cannot_boot_a_kernel_refuses_such_an_image():
    from drivers.vmware.driver import VMwareDriver

    vmdk = dataclasses.replace(IMAGE, format="vmdk", **KERNEL, **SUMS)
    driver = VMwareDriver("https://vcenter.example.org/sdk")  # (no connection: the check comes first)
    with pytest.raises(Invalid, match="vmware hosts cannot boot a kernel directly") as caught:
        driver.check_image(vmdk)
    assert caught.value.permanent
    driver.check_image(dataclasses.replace(vmdk, **dict.fromkeys((*KERNEL, *SUMS), "")))
    assert registry.KERNEL_BOOT_TYPES == {"kvm", "sim"}
