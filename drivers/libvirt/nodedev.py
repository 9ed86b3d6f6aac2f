"""A host's GPUs and vGPU types from libvirt's node-device XML, and the XML that uses them.

Pure functions (no connection), so realistic XML from real hosts is testable on its own.

What counts (``HostFacts.devices``, as ``inventory/devices.py`` describes the records):

- a PCI display controller (class ``0x03xxxx``) is a ``gpu``, grouped by model: a slug of the
  vendor and the product's marketing name (``NVIDIA Corporation`` / ``GA100 [A100 PCIe 40GB]``
  → ``nvidia-a100-pcie-40gb``; lspci's convention puts the marketing name in brackets);
- a PCI device with a ``mdev_types`` capability (a GPU whose host driver makes vGPUs) gives one
  ``mdev`` record per type instead, ``count`` its ``availableInstances`` (what can still be made),
  model a slug of the type's name (``GRID T4-2Q`` → ``nvidia-t4-2q``) or else of its id. Such a
  device is not also a whole ``gpu``: its vGPU driver holds it.
- The display controllers of baseboard management controllers (ASPEED, Matrox G200) are the
  host's own console, never passed through.
"""

import dataclasses
import re
import uuid
import xml.etree.ElementTree as ET

# PCI vendor ids → the short names models start with (others: the vendor name's first word).
VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel", 0x1AF4: "virtio", 0x1234: "qemu"}
BMC_VENDORS = {0x1A03, 0x102B}  # ASPEED, Matrox (iDRAC's and iLO's G200): the host's console
DISPLAY_CLASS = 0x03
_UUID_NS = uuid.UUID("9a7e2c41-5d0b-4f1e-8c3a-2b6f0e9d4c17")


@dataclasses.dataclass(frozen=True)
class Found:
    """One usable thing on the host: a whole GPU (``type_id`` "") or a vGPU type of a parent."""

    kind: str  # gpu | mdev
    vendor: str
    model: str
    device: str  # the node device's name (pci_0000_3b_00_0): an mdev's parent
    address: str  # 0000:3b:00.0
    pci: tuple  # (domain, bus, slot, function) as numbers
    type_id: str = ""
    available: int = 1


def slug(text):
    """Lower-case letters, digits, '.', '_' and '-', words joined by '-' (at most 100)."""
    words = re.findall(r"[a-z0-9._]+", text.lower())
    return "-".join(w.strip("._") for w in words if w.strip("._"))[:100].rstrip("-._")


def _int(text, default=0):
    try:
        return int(text or "", 0)
    except ValueError:
        return default


def _vendor(cap):
    element = cap.find("vendor")
    vendor_id = _int(element.get("id") if element is not None else None)
    if vendor_id in VENDORS:
        return vendor_id, VENDORS[vendor_id]
    name = (element.text or "") if element is not None else ""
    words = slug(name).split("-")
    return vendor_id, words[0] if words and words[0] else f"v{vendor_id:04x}"


def _product(cap):
    element = cap.find("product")
    name = (element.text or "").strip() if element is not None else ""
    marketing = re.findall(r"\[([^\]]+)\]", name)
    text = slug(marketing[-1] if marketing else name)
    if not text and element is not None:
        text = f"{_int(element.get('id')):04x}"
    return text


def _model(vendor, name):
    name = name.removeprefix(f"{vendor}-")
    return slug(f"{vendor}-{name}") if name else vendor


def parse(xml_text):
    """The ``Found`` things of one node device's XML ([] for anything not a GPU or vGPU parent)."""
    root = ET.fromstring(xml_text)
    cap = next((c for c in root.findall("capability") if c.get("type") == "pci"), None)
    if cap is None:
        return []
    pci = tuple(_int(cap.findtext(part)) for part in ("domain", "bus", "slot", "function"))
    address = "{:04x}:{:02x}:{:02x}.{:x}".format(*pci)
    vendor_id, vendor = _vendor(cap)
    name = root.findtext("name") or ""
    types = next((c for c in cap.findall("capability") if c.get("type") == "mdev_types"), None)
    if types is not None:
        return [_mdev(t, vendor, name, address, pci) for t in types.findall("type") if t.get("id")]
    if _int(cap.findtext("class"), -1) >> 16 != DISPLAY_CLASS or vendor_id in BMC_VENDORS:
        return []
    return [Found("gpu", vendor, _model(vendor, _product(cap)), name, address, pci)]


def _mdev(element, vendor, parent, address, pci):
    type_id = element.get("id")
    label = re.sub(r"^grid[\s_-]+", "", (element.findtext("name") or "").strip(), flags=re.IGNORECASE)
    model = _model(vendor, slug(label) or slug(type_id))
    available = max(_int(element.findtext("availableInstances")), 0)
    return Found("mdev", vendor, model, parent, address, pci, type_id, available)


def found_all(xml_texts):
    return [thing for text in xml_texts for thing in parse(text)]


def records(found):
    """``Found`` things as ``HostFacts.devices`` records: one per model, ``count`` summed, the
    PCI addresses (of the GPUs, or of a vGPU type's parents) sorted."""
    by_model = {}
    for thing in found:
        record = by_model.setdefault(
            thing.model, {"kind": thing.kind, "vendor": thing.vendor, "model": thing.model, "count": 0, "addresses": []}
        )
        record["count"] += thing.available
        if thing.address not in record["addresses"]:
            record["addresses"].append(thing.address)
    for record in by_model.values():
        record["addresses"].sort()
    return [by_model[model] for model in sorted(by_model)]


def device_records(xml_texts):
    """Node devices' XML strings → the host's device records (the pure whole of discovery)."""
    return records(found_all(xml_texts))


# --- what a domain uses -----------------------------------------------------------------------


def used_by(domain_xml_text):
    """The PCI addresses (``(domain, bus, slot, function)``) and mdev UUIDs a domain's hostdevs hold."""
    root = ET.fromstring(domain_xml_text)
    addresses, uuids = set(), set()
    for hostdev in root.iterfind("devices/hostdev"):
        address = hostdev.find("source/address")
        if address is None:
            continue
        if hostdev.get("type") == "pci":
            addresses.add(tuple(_int(address.get(p)) for p in ("domain", "bus", "slot", "function")))
        elif hostdev.get("type") == "mdev" and address.get("uuid"):
            uuids.add(address.get("uuid"))
    return addresses, uuids


def mdev_uuid(key, fingerprint, index):
    """The UUID of a VM's ``index``-th vGPU: the same for a retried create (no second mdev)."""
    return str(uuid.uuid5(_UUID_NS, f"{key}/{fingerprint}/{index}"))


def mdev_name(mdev_uuid_text):
    """libvirt's node-device name of the mdev with that UUID."""
    return "mdev_" + mdev_uuid_text.replace("-", "_")


def mdev_xml(parent, type_id, mdev_uuid_text):
    """The definition of one mediated device of ``type_id`` on the node device ``parent``."""
    root = ET.Element("device")
    ET.SubElement(root, "parent").text = parent
    cap = ET.SubElement(root, "capability", {"type": "mdev"})
    ET.SubElement(cap, "type", {"id": type_id})
    ET.SubElement(cap, "uuid").text = mdev_uuid_text
    return ET.tostring(root, encoding="unicode")


@dataclasses.dataclass(frozen=True)
class Passthrough:
    """What a domain gets: PCI addresses passed through whole, and vGPUs (parent, type, uuid)."""

    pci: tuple = ()
    mdevs: tuple = ()


def choose(found, asked, in_use, key, fingerprint, host):
    """The devices a VM gets: for each model → count in ``asked``, whole GPUs not in ``in_use``
    (PCI tuples other domains hold), or vGPU instances on parents with some available.

    Raises ``LookupError`` naming the model and ``host`` when there are not enough."""
    pci, mdevs = [], []
    for model, count in sorted(asked.items()):
        count = int(count)
        parents = [f for f in found if f.model == model and f.kind == "mdev"]
        if parents:
            slots = [f for f in parents for _ in range(f.available)]
            if len(slots) < count:
                raise LookupError(f"{host} can make {len(slots)} more vGPUs of model {model}, {count} asked")
            for f in slots[:count]:
                mdevs.append((f.device, f.type_id, mdev_uuid(key, fingerprint, len(mdevs))))
            continue
        free = sorted(f.pci for f in found if f.model == model and f.kind == "gpu" and f.pci not in in_use)
        if len(free) < count:
            raise LookupError(f"{host} has {len(free)} free GPUs of model {model}, {count} asked")
        pci += free[:count]
    return Passthrough(tuple(pci), tuple(mdevs))


def hostdev_elements(passthrough):
    """The domain's ``<hostdev>`` elements for ``passthrough``."""
    elements = []
    for domain, bus, slot, function in passthrough.pci:
        hostdev = ET.Element("hostdev", {"mode": "subsystem", "type": "pci", "managed": "yes"})
        source = ET.SubElement(hostdev, "source")
        address = {"domain": f"0x{domain:04x}", "bus": f"0x{bus:02x}", "slot": f"0x{slot:02x}"}
        ET.SubElement(source, "address", {**address, "function": f"0x{function:x}"})
        elements.append(hostdev)
    for _parent, _type, mdev_uuid_text in passthrough.mdevs:
        hostdev = ET.Element("hostdev", {"mode": "subsystem", "type": "mdev", "model": "vfio-pci"})
        source = ET.SubElement(hostdev, "source")
        ET.SubElement(source, "address", {"uuid": mdev_uuid_text})
        elements.append(hostdev)
    return elements
