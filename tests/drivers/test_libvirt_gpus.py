"""GPUs on libvirt's test driver: discovery from a node file's devices, the domains' hostdevs,
and libvirt's own schema (``virt-xml-validate``) on the domain XML that passes GPUs through.

tests/data/libvirt/gpu/gpu-host.xml holds two A100s, a T4 offering vGPU types, the BMC's VGA
and a NIC. The test driver defines and starts domains with hostdevs without touching any
device: no GPU is passed through here, and the test driver cannot make mediated devices.
"""

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from drivers.base import Conflict, VMSpec, VMState
from drivers.libvirt import domxml, nodedev
from tests.drivers.conftest import image_file, next_key, require_libvirt, schema_check

GPU_HOST = Path(__file__).resolve().parents[1] / "data" / "libvirt" / "gpu" / "gpu-host.xml"
A100 = "nvidia-a100-pcie-40gb"


@pytest.fixture
def gpu_host(tmp_path):
    """A driver on a private copy of the GPU node (the test driver's state is per connection)."""
    require_libvirt()
    from drivers.libvirt.connection import connections
    from drivers.libvirt.driver import LibvirtDriver

    path = tmp_path / "gpu-host.xml"
    shutil.copy(GPU_HOST, path)
    driver = LibvirtDriver(f"test://{path}")
    driver.image = image_file(tmp_path, "cuda-24.04", "qcow2")
    driver.stage_image(driver.image)
    yield driver
    connections.forget(driver.uri)


def spec(driver, gpus=None, key=None):
    return VMSpec(key or next_key(), 2, 2048, 10, driver.image, gpus=gpus or {})


def hostdevs(driver, key):
    return ET.fromstring(driver.conn.lookupByName(key).XMLDesc(0)).findall("devices/hostdev")


def validate(tmp_path, text):
    path = tmp_path / "domain.xml"
    path.write_text(text)
    return schema_check(path, "domain")


def test_discovery_reports_the_gpus_and_vgpu_types_of_the_node(gpu_host):
    facts = gpu_host.facts()

    assert facts.devices == [
        {"kind": "gpu", "vendor": "nvidia", "model": A100, "count": 2, "addresses": ["0000:17:00.0", "0000:65:00.0"]},
        {"kind": "mdev", "vendor": "nvidia", "model": "nvidia-t4-16q", "count": 1, "addresses": ["0000:3b:00.0"]},
        {"kind": "mdev", "vendor": "nvidia", "model": "nvidia-t4-1b", "count": 16, "addresses": ["0000:3b:00.0"]},
    ]


def test_a_node_without_gpus_reports_an_empty_list_not_unknown(libvirt_nodes):
    from drivers.libvirt.driver import LibvirtDriver

    assert LibvirtDriver(libvirt_nodes["kvm-small"]).facts().devices == []


def test_each_vm_gets_a_gpu_no_other_domain_holds(gpu_host):
    first, second = spec(gpu_host, {A100: 1}), spec(gpu_host, {A100: 1})

    gpu_host.create(first)
    gpu_host.create(second)

    addresses = [hostdevs(gpu_host, s.key)[0].find("source/address").attrib for s in (first, second)]
    assert [(a["domain"], a["bus"], a["slot"], a["function"]) for a in addresses] == [
        ("0x0000", "0x17", "0x00", "0x0"),
        ("0x0000", "0x65", "0x00", "0x0"),
    ]
    assert hostdevs(gpu_host, first.key)[0].attrib == {"mode": "subsystem", "type": "pci", "managed": "yes"}


def test_a_retried_create_keeps_the_gpus_it_chose(gpu_host):
    first = spec(gpu_host, {A100: 2})
    gpu_host.create(first)

    gpu_host.create(first)

    assert len(hostdevs(gpu_host, first.key)) == 2
    assert [d.name() for d in gpu_host.conn.listAllDomains()] == [first.key]


def test_no_free_gpu_fails_naming_the_model_and_host_and_leaves_nothing_made(gpu_host):
    gpu_host.create(spec(gpu_host, {A100: 2}))
    late = spec(gpu_host, {A100: 1})

    with pytest.raises(Conflict, match=f"gpu-host has 0 free GPUs of model {A100}, 1 asked"):
        gpu_host.create(late)

    assert gpu_host.state(late.key) == VMState.ABSENT
    assert f"{late.key}.qcow2" not in [vol.name() for vol in gpu_host._pool().listAllVolumes()]


def test_a_destroyed_vms_gpu_goes_to_the_next_one(gpu_host):
    held = spec(gpu_host, {A100: 2})
    gpu_host.create(held)
    gpu_host.destroy(held.key)

    late = spec(gpu_host, {A100: 2})
    gpu_host.create(late)

    assert len(hostdevs(gpu_host, late.key)) == 2


def test_a_vgpu_is_an_mdev_hostdev_and_the_vm_starts_and_is_destroyed(gpu_host):
    vm = spec(gpu_host, {"nvidia-t4-1b": 1})

    gpu_host.create(vm)
    gpu_host.start(vm.key)

    (hostdev,) = hostdevs(gpu_host, vm.key)
    assert (hostdev.get("mode"), hostdev.get("type"), hostdev.get("model")) == ("subsystem", "mdev", "vfio-pci")
    assert hostdev.find("source/address").get("uuid") == nodedev.mdev_uuid(vm.key, vm.fingerprint(), 0)
    assert gpu_host.state(vm.key) == VMState.RUNNING
    gpu_host.destroy(vm.key)
    assert gpu_host.state(vm.key) == VMState.ABSENT


def test_a_model_the_host_lacks_is_refused(gpu_host):
    with pytest.raises(Conflict, match="0 free GPUs of model nvidia-h100"):
        gpu_host.create(spec(gpu_host, {"nvidia-h100": 1}))


def test_the_domain_with_gpus_is_valid_for_libvirts_schema(gpu_host, tmp_path):
    import libvirt

    vm = spec(gpu_host, {A100: 1, "nvidia-t4-1b": 1})
    vgpu = ("pci_0000_3b_00_0", "nvidia-222", nodedev.mdev_uuid(vm.key, vm.fingerprint(), 0))
    passthrough = nodedev.Passthrough(pci=((0, 0x17, 0, 0),), mdevs=(vgpu,))
    authored = domxml.domain_xml(
        vm, domain_type="kvm", disk_path="/images/x.qcow2", hostdevs=nodedev.hostdev_elements(passthrough)
    )
    gpu_host.create(vm)
    defined = gpu_host.conn.lookupByName(vm.key).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)

    for text in (authored, defined):
        assert [h.get("type") for h in ET.fromstring(text).findall("devices/hostdev")] == ["pci", "mdev"]
        done = validate(tmp_path, text)
        assert done.returncode == 0, done.stderr or done.stdout


def test_the_schema_check_can_fail(tmp_path):
    broken = "<domain type='kvm'><name>x</name><devices><hostdev mode='subsystem' type='pci'/></devices></domain>"

    assert validate(tmp_path, broken).returncode != 0


def test_gpus_change_the_fingerprint_and_none_keep_the_old_one(gpu_host):
    plain = spec(gpu_host, key="vcl-5")

    assert spec(gpu_host, {A100: 1}, key="vcl-5").fingerprint() != plain.fingerprint()
    assert plain.fingerprint() == VMSpec("vcl-5", 2, 2048, 10, gpu_host.image).fingerprint()


def test_a_bad_gpu_ask_never_reaches_libvirt(gpu_host):
    from drivers.base import Invalid

    with pytest.raises(Invalid, match="GPU model"):
        gpu_host.create(spec(gpu_host, {"a100'/><x": 1}))
    with pytest.raises(Invalid, match="whole number"):
        gpu_host.create(spec(gpu_host, {A100: 0}))


# --- the vGPU lifecycle -----------------------------------------------------------------------
# libvirt's test driver has no mediated devices (``virNodeDeviceDefineXML`` is not supported,
# ``virNodeDeviceCreateXML`` makes only vHBAs), so these tests put a stand-in for those calls
# in front of it: the domains are still the test driver's, the mdev calls are recorded.


class _Error(Exception):
    pass


class MdevHost:
    """The test driver's connection, plus node devices of type mdev kept in a dict."""

    def __init__(self, conn, define=True, fail_on=None):
        self.conn, self.define, self.fail_on = conn, define, fail_on
        self.mdevs, self.calls = {}, []

    def __getattr__(self, name):
        return getattr(self.conn, name)

    def nodeDeviceLookupByName(self, name):
        if name.startswith("mdev_") and name in self.mdevs:
            return self.mdevs[name]
        return self.conn.nodeDeviceLookupByName(name)  # the test driver's "not found"

    def _add(self, xml, persistent, active):
        root = ET.fromstring(xml)
        uuid = root.findtext("capability/uuid")
        if uuid == self.fail_on:
            raise_libvirt("VIR_ERR_OPERATION_FAILED", f"mdevctl failed for {uuid}")
        device = Mdev(self, uuid, root.findtext("parent"), root.find("capability/type").get("id"), persistent, active)
        self.mdevs[nodedev.mdev_name(uuid)] = device
        return device

    def nodeDeviceDefineXML(self, xml, flags):
        if not self.define:
            raise_libvirt("VIR_ERR_NO_SUPPORT", "virNodeDeviceDefineXML")
        self.calls.append(("define", ET.fromstring(xml).findtext("capability/uuid")))
        return self._add(xml, persistent=True, active=False)

    def nodeDeviceCreateXML(self, xml, flags):
        self.calls.append(("create-transient", ET.fromstring(xml).findtext("capability/uuid")))
        return self._add(xml, persistent=False, active=True)


class Mdev:
    def __init__(self, host, uuid, parent, type_id, persistent, active):
        self.host, self.uuid, self.parent, self.type_id = host, uuid, parent, type_id
        self.persistent, self.active, self.autostart = persistent, active, False

    def setAutostart(self, on):
        self.autostart = bool(on)

    def create(self, flags):
        self.host.calls.append(("start", self.uuid))
        self.active = True

    def destroy(self):
        self.host.calls.append(("stop", self.uuid))
        self.active = False
        if not self.persistent:
            del self.host.mdevs[nodedev.mdev_name(self.uuid)]

    def undefine(self, flags):
        self.host.calls.append(("undefine", self.uuid))
        del self.host.mdevs[nodedev.mdev_name(self.uuid)]

    def isActive(self):
        return self.active

    def isPersistent(self):
        return self.persistent


def raise_libvirt(code_name, message):
    import libvirt

    exc = libvirt.libvirtError(message)
    exc.err = (getattr(libvirt, code_name), 0, message, 2, None, None, None, 0, 0)
    raise exc


@pytest.fixture
def mdev_host(gpu_host, monkeypatch):
    """``gpu_host`` as a host whose libvirt makes mediated devices (``MdevHost``)."""
    from drivers.libvirt.driver import LibvirtDriver

    host = MdevHost(gpu_host.conn)
    monkeypatch.setattr(LibvirtDriver, "conn", property(lambda self: host))
    gpu_host.emulated = False  # the one switch that says the test driver makes no mdevs
    gpu_host.options["domain_type"] = "test"
    gpu_host.mdev_host = host
    return gpu_host


def test_a_vgpu_is_defined_autostarted_and_started_before_the_domain_and_removed_after(mdev_host):
    vm = spec(mdev_host, {"nvidia-t4-1b": 2})
    uuids = [nodedev.mdev_uuid(vm.key, vm.fingerprint(), i) for i in range(2)]

    mdev_host.create(vm)

    host = mdev_host.mdev_host
    assert host.calls == [("define", uuids[0]), ("start", uuids[0]), ("define", uuids[1]), ("start", uuids[1])]
    made = [host.mdevs[nodedev.mdev_name(u)] for u in uuids]
    assert [(m.parent, m.type_id, m.active, m.autostart) for m in made] == [
        ("pci_0000_3b_00_0", "nvidia-222", True, True)
    ] * 2
    host.calls.clear()

    mdev_host.destroy(vm.key)

    assert sorted(host.calls, key=lambda call: call[1]) == sorted(
        [("stop", u) for u in uuids] + [("undefine", u) for u in uuids], key=lambda call: (call[1], call[0] != "stop")
    )
    assert host.mdevs == {}


def test_a_retried_create_makes_no_second_vgpu(mdev_host):
    vm = spec(mdev_host, {"nvidia-t4-1b": 1})
    mdev_host.create(vm)

    mdev_host.create(vm)

    assert [call for call in mdev_host.mdev_host.calls if call[0] == "define"] == [
        ("define", nodedev.mdev_uuid(vm.key, vm.fingerprint(), 0))
    ]


def test_a_vgpu_that_cannot_be_made_leaves_no_vgpu_disk_or_domain(mdev_host):
    vm = spec(mdev_host, {"nvidia-t4-1b": 2})
    mdev_host.mdev_host.fail_on = nodedev.mdev_uuid(vm.key, vm.fingerprint(), 1)

    with pytest.raises(Conflict, match="mdevctl failed"):
        mdev_host.create(vm)

    assert mdev_host.mdev_host.mdevs == {}
    assert mdev_host.state(vm.key) == VMState.ABSENT
    assert f"{vm.key}.qcow2" not in [vol.name() for vol in mdev_host._pool().listAllVolumes()]


def test_a_stopped_vgpu_is_started_again_before_its_vm(mdev_host):
    vm = spec(mdev_host, {"nvidia-t4-1b": 1})
    mdev_host.create(vm)
    (made,) = mdev_host.mdev_host.mdevs.values()
    made.active = False  # as after a host reboot without autostart

    mdev_host.start(vm.key)

    assert made.active and mdev_host.state(vm.key) == VMState.RUNNING


def test_an_older_libvirt_makes_a_transient_vgpu(mdev_host):
    mdev_host.mdev_host.define = False
    vm = spec(mdev_host, {"nvidia-t4-1b": 1})

    mdev_host.create(vm)
    mdev_host.destroy(vm.key)

    uuid = nodedev.mdev_uuid(vm.key, vm.fingerprint(), 0)
    assert mdev_host.mdev_host.calls == [("create-transient", uuid), ("stop", uuid)]
    assert mdev_host.mdev_host.mdevs == {}


def test_a_vm_holding_gpus_is_not_migrated(gpu_host, libvirt_nodes):
    from drivers.base import Invalid
    from drivers.libvirt.driver import LibvirtDriver

    vm = spec(gpu_host, {A100: 1})
    gpu_host.create(vm)
    target = LibvirtDriver(libvirt_nodes["kvm-medium"])

    with pytest.raises(Invalid, match="1 GPU device.* of gpu-host passed through and cannot move"):
        gpu_host.migrate(vm.key, target)

    assert gpu_host.state(vm.key) == VMState.STOPPED and target.state(vm.key) == VMState.ABSENT
