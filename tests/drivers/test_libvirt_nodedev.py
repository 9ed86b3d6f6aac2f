"""GPU discovery and passthrough XML from node-device XML (drivers/libvirt/nodedev.py: pure).

The node devices in tests/data/libvirt/gpu/nodedev are as ``virsh nodedev-dumpxml`` prints
them on real hosts; a test checks them against libvirt's own schema, so they stay realistic.
"""

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from drivers.libvirt import nodedev
from inventory.devices import MODEL_RE, device_errors
from tests.drivers.conftest import schema_check

NODEDEV = Path(__file__).resolve().parents[1] / "data" / "libvirt" / "gpu" / "nodedev"


def xml(*names):
    return [(NODEDEV / f"{name}.xml").read_text() for name in names]


def test_the_sample_node_devices_are_valid_for_libvirts_schema():
    for path in sorted(NODEDEV.glob("*.xml")):
        done = schema_check(path, "nodedev")
        assert done.returncode == 0, f"{path.name}: {done.stderr or done.stdout}"


def test_a_whole_gpu_is_one_record_of_its_vendor_and_marketing_name():
    assert nodedev.device_records(xml("a100-pf")) == [
        {"kind": "gpu", "vendor": "nvidia", "model": "nvidia-a100-pcie-40gb", "count": 1, "addresses": ["0000:17:00.0"]}
    ]


def test_gpus_of_one_model_are_counted_together():
    second = xml("a100-pf")[0].replace("<bus>23</bus>", "<bus>101</bus>").replace("pci_0000_17", "pci_0000_65")

    (record,) = nodedev.device_records([*xml("a100-pf"), second])

    assert (record["count"], record["addresses"]) == (2, ["0000:17:00.0", "0000:65:00.0"])


def test_a_vgpu_parent_gives_one_mdev_record_per_type_and_no_whole_gpu():
    records = nodedev.device_records(xml("t4-vgpu"))

    assert [(r["kind"], r["model"], r["count"]) for r in records] == [
        ("mdev", "nvidia-t4-1b", 16),
        ("mdev", "nvidia-t4-2b", 8),
        ("mdev", "nvidia-t4-2q", 0),  # all made: known, none available
    ]
    assert {tuple(r["addresses"]) for r in records} == {("0000:3b:00.0",)}


def test_an_mdev_type_without_a_name_is_named_by_its_id():
    text = xml("t4-vgpu")[0].replace("<name>GRID T4-1B</name>", "")

    models = [r["model"] for r in nodedev.device_records([text])]

    assert "nvidia-222" in models  # the id already starts with the vendor: not nvidia-nvidia-222


def test_integrated_and_amd_gpus_count_but_a_nic_and_the_bmcs_display_do_not():
    records = nodedev.device_records(xml("intel-igpu", "amd-radeon", "nic", "aspeed-bmc-vga"))

    assert [(r["model"], r["vendor"], r["addresses"]) for r in records] == [
        ("amd-radeon-rx-6800-6800-xt-6900-xt", "amd", ["0000:0b:00.0"]),
        ("intel-uhd-graphics-630", "intel", ["0000:00:02.0"]),
    ]


def test_every_record_is_valid_for_the_hosts_device_list():
    records = nodedev.device_records(xml("a100-pf", "t4-vgpu", "intel-igpu", "amd-radeon", "nic", "aspeed-bmc-vga"))

    assert device_errors(records) is None
    assert all(MODEL_RE.match(r["model"]) for r in records)


def test_an_unknown_vendor_and_an_unnamed_product_still_give_a_valid_model():
    text = (
        xml("amd-radeon")[0]
        .replace("<vendor id='0x1002'>Advanced Micro Devices, Inc. [AMD/ATI]</vendor>", "<vendor id='0x1bb1'/>")
        .replace("Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]", "")
    )

    (record,) = nodedev.device_records([text])

    assert record["model"] == "v1bb1-73bf" and MODEL_RE.match(record["model"])


def test_a_pci_device_of_an_older_libvirt_without_a_class_is_not_taken_for_a_gpu():
    text = xml("a100-pf")[0].replace("<class>0x030200</class>", "")

    assert nodedev.device_records([text]) == []


def test_non_pci_devices_are_ignored():
    usb = "<device><name>usb_1_1</name><capability type='usb_device'><bus>1</bus></capability></device>"

    assert nodedev.device_records([usb]) == []


# --- choosing devices for a VM --------------------------------------------------------------


def test_a_vm_gets_the_free_gpus_of_its_model():
    found = nodedev.found_all(xml("a100-pf", "intel-igpu"))
    second = nodedev.found_all([xml("a100-pf")[0].replace("<bus>23</bus>", "<bus>101</bus>")])

    chosen = nodedev.choose([*found, *second], {"nvidia-a100-pcie-40gb": 1}, {(0, 23, 0, 0)}, "vcl-1", "f", "h1")

    assert chosen == nodedev.Passthrough(pci=((0, 101, 0, 0),))


def test_too_few_free_gpus_is_refused_naming_the_model_and_the_host():
    found = nodedev.found_all(xml("a100-pf"))

    with pytest.raises(LookupError, match=r"h1 has 0 free GPUs of model nvidia-a100-pcie-40gb, 1 asked"):
        nodedev.choose(found, {"nvidia-a100-pcie-40gb": 1}, {(0, 23, 0, 0)}, "vcl-1", "f", "h1")
    with pytest.raises(LookupError, match="h1 has 0 free GPUs of model nvidia-h100"):
        nodedev.choose(found, {"nvidia-h100": 1}, set(), "vcl-1", "f", "h1")


def test_vgpus_are_new_instances_of_the_type_with_uuids_stable_per_vm():
    found = nodedev.found_all(xml("t4-vgpu"))

    chosen = nodedev.choose(found, {"nvidia-t4-2b": 2}, set(), "vcl-7", "fp", "h1")
    again = nodedev.choose(found, {"nvidia-t4-2b": 2}, set(), "vcl-7", "fp", "h1")

    assert [(parent, type_id) for parent, type_id, _ in chosen.mdevs] == [("pci_0000_3b_00_0", "nvidia-223")] * 2
    assert chosen == again and len({u for *_, u in chosen.mdevs}) == 2
    with pytest.raises(LookupError, match="h1 can make 0 more vGPUs of model nvidia-t4-2q, 1 asked"):
        nodedev.choose(found, {"nvidia-t4-2q": 1}, set(), "vcl-7", "fp", "h1")


def test_hostdev_xml_names_the_pci_address_or_the_mdev_uuid():
    passthrough = nodedev.Passthrough(pci=((0, 0x3B, 0x1F, 7),), mdevs=(("pci_0000_3b_00_0", "nvidia-223", "u-1"),))

    pci, mdev = nodedev.hostdev_elements(passthrough)

    assert pci.attrib == {"mode": "subsystem", "type": "pci", "managed": "yes"}
    assert pci.find("source/address").attrib == {"domain": "0x0000", "bus": "0x3b", "slot": "0x1f", "function": "0x7"}
    assert mdev.attrib == {"mode": "subsystem", "type": "mdev", "model": "vfio-pci"}
    assert mdev.find("source/address").attrib == {"uuid": "u-1"}


def test_what_a_domain_holds_is_read_back_from_its_hostdevs():
    root = ET.Element("domain")
    devices = ET.SubElement(root, "devices")
    passthrough = nodedev.Passthrough(pci=((0, 23, 0, 0),), mdevs=(("p", "t", "u-1"),))
    devices.extend(nodedev.hostdev_elements(passthrough))

    assert nodedev.used_by(ET.tostring(root, encoding="unicode")) == ({(0, 23, 0, 0)}, {"u-1"})


def test_the_mdev_definition_names_parent_type_and_uuid():
    root = ET.fromstring(nodedev.mdev_xml("pci_0000_3b_00_0", "nvidia-223", "b1ae8bf6-38b0-4c81-9d44-78ce3f520496"))

    assert root.findtext("parent") == "pci_0000_3b_00_0"
    assert root.find("capability").get("type") == "mdev"
    assert root.find("capability/type").get("id") == "nvidia-223"
    assert root.findtext("capability/uuid") == "b1ae8bf6-38b0-4c81-9d44-78ce3f520496"
    assert nodedev.mdev_name("b1ae8bf6-38b0-4c81-9d44-78ce3f520496") == "mdev_b1ae8bf6_38b0_4c81_9d44_78ce3f520496"
