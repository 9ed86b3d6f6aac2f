"""libvirt XML authored from a VMSpec, with ElementTree (which escapes every value).

Pure functions: no connection needed, so the XML is testable on its own.
"""

import hashlib
import uuid
import xml.etree.ElementTree as ET

NAMESPACE = "https://vclmgr.example.org/xmlns/libvirt/1"
QEMU_NAMESPACE = "http://libvirt.org/schemas/domain/qemu/1.0"
ET.register_namespace("vclmgr", NAMESPACE)
ET.register_namespace("qemu", QEMU_NAMESPACE)
USER_NETWORK = "user"  # the network option for QEMU user-mode networking (one-machine setups)
_UUID_NS = uuid.UUID("3c4d1a6e-6f0b-4a55-9d7e-5b1d0d1f6a01")


def domain_uuid(spec):
    """Derived from key and fingerprint: a retried define is an update of the same domain,
    while a different VM with the same name is refused by libvirt ("already exists")."""
    return str(uuid.uuid5(_UUID_NS, f"{spec.key}/{spec.fingerprint()}"))


def mac_address(key):
    """A stable locally administered MAC (QEMU's 52:54:00 prefix), so DHCP leases follow the VM."""
    digest = hashlib.sha256(key.encode()).digest()
    return "52:54:00:" + ":".join(f"{byte:02x}" for byte in digest[:3])


def _sub(parent, tag, text=None, **attrs):
    element = ET.SubElement(parent, tag, {k.rstrip("_"): str(v) for k, v in attrs.items()})
    if text is not None:
        element.text = str(text)
    return element


def domain_xml(
    spec,
    *,
    domain_type,
    disk_path,
    disk_format="qcow2",
    seed_path=None,
    cpu_mode=None,
    network=None,
    forward_port=None,
    seed_digest=None,
    disk_cache="none",
    vnc_listen="127.0.0.1",
    hostdevs=(),
    kernel=None,
    initrd=None,
    cmdline="",
):
    """The persistent definition of the VM: vcpus, memory, the overlay disk, the NoCloud seed
    as a read-only CD-ROM (``seed_path``), one NIC and one more per private network
    (``spec.private_networks``, virtio on their fixed MACs), a serial console, the guest agent channel,
    and a VNC display on ``vnc_listen`` (the host's loopback by default: only vclmgr's console
    proxy on that host reaches it; None: no display), its port picked by libvirt at start.

    ``cpu_mode``: ``host-model``, ``host-passthrough``, ``maximum`` or ``custom:<model>``;
    None: QEMU's default CPU. ``disk_cache``: the overlay's libvirt cache mode (None: QEMU's
    default). ``network`` (default ``spec.network``): a libvirt network,
    ``bridge:<name>``, or ``user``: QEMU user-mode networking with ``restrict=on`` (no route
    out of the guest, not even to the host) and one forward, ``127.0.0.1:forward_port`` to the
    guest's ``spec.extra["guest_port"]`` (libvirt 9's ``<interface type='user'>`` cannot
    forward without passt, hence ``<qemu:commandline>``). ``hostdevs``: ``<hostdev>`` elements
    of the GPUs passed through (``nodedev.hostdev_elements``).

    ``kernel`` (a path on the host): direct kernel boot, with ``initrd`` (optional) and the
    ``cmdline``; the disk is not booted then (no ``<boot dev='hd'/>``), only attached.
    """
    network = network or spec.network
    root = ET.Element("domain", {"type": domain_type})
    _sub(root, "name", spec.key)
    _sub(root, "uuid", domain_uuid(spec))
    _sub(root, "title", f"vclmgr {spec.key} ({spec.image.name})")
    metadata = _sub(root, "metadata")
    mine = {"key": spec.key, "fingerprint": spec.fingerprint(), "image": spec.image.name}
    if forward_port:
        mine["port"] = str(forward_port)
    if spec.guest is not None:  # which seed the VM boots with (reseed compares); no secret in it
        mine["instance"] = spec.guest.instance_id
    if seed_digest:
        mine["seed"] = seed_digest
    ET.SubElement(metadata, f"{{{NAMESPACE}}}vm", mine)
    _sub(root, "memory", spec.memory_mib, unit="MiB")
    _sub(root, "currentMemory", spec.memory_mib, unit="MiB")
    _sub(root, "vcpu", spec.vcpus, placement="static")
    os_ = _sub(root, "os")
    _sub(os_, "type", "hvm")
    if kernel:
        _sub(os_, "kernel", kernel)
        if initrd:
            _sub(os_, "initrd", initrd)
        if cmdline:
            _sub(os_, "cmdline", cmdline)
    else:
        _sub(os_, "boot", dev="hd")
    features = _sub(root, "features")
    _sub(features, "acpi")  # graceful shutdown is an ACPI power button press
    _sub(features, "apic")
    if cpu_mode and cpu_mode.startswith("custom:"):
        cpu = _sub(root, "cpu", mode="custom", match="exact")
        _sub(cpu, "model", cpu_mode.removeprefix("custom:"), fallback="allow")
    elif cpu_mode:
        _sub(root, "cpu", mode=cpu_mode)
    _sub(root, "clock", offset="utc")
    _sub(root, "on_poweroff", "destroy")
    _sub(root, "on_reboot", "restart")
    _sub(root, "on_crash", "destroy")

    devices = _sub(root, "devices")
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type=disk_format, **({"cache": disk_cache} if disk_cache else {}))
    _sub(disk, "source", file=disk_path)
    _sub(disk, "target", dev="vda", bus="virtio")
    if seed_path:
        devices.append(seed_cdrom_xml(seed_path))
    if network != USER_NETWORK:
        devices.append(interface_xml(network, mac_address(spec.key)))
    for private, mac in spec.private_networks:
        devices.append(interface_xml(private, mac))
    serial = _sub(devices, "serial", type="pty")
    _sub(serial, "target", port=0)
    console = _sub(devices, "console", type="pty")
    _sub(console, "target", type="serial", port=0)
    if vnc_listen:
        devices.append(vnc_xml(vnc_listen))
    agent = _sub(devices, "channel", type="unix")  # the guest agent reports addresses without DHCP
    _sub(agent, "target", type="virtio", name="org.qemu.guest_agent.0")
    devices.extend(hostdevs)
    if network == USER_NETWORK:
        root.append(user_network_xml(forward_port, spec.extra.get("guest_port", 22), mac_address(spec.key)))
    return ET.tostring(root, encoding="unicode")


def vnc_xml(listen):
    """A VNC display without a password: whoever reaches the port has the screen, so it
    listens on the host's loopback (vclmgr's proxy hands it out per one-time ticket)."""
    graphics = ET.Element("graphics", {"type": "vnc", "port": "-1", "autoport": "yes", "listen": listen})
    _sub(graphics, "listen", type="address", address=listen)
    return graphics


def vnc_port(xml_text):
    """The port of the running domain's VNC display (from its live XML), or None."""
    for graphics in ET.fromstring(xml_text).iterfind("devices/graphics"):
        port = graphics.get("port", "-1")
        if graphics.get("type") == "vnc" and port.isdigit() and int(port) > 0:
            listen = graphics.find("listen")
            address = listen.get("address") if listen is not None else None
            return address or graphics.get("listen") or "127.0.0.1", int(port)
    return None


def seed_cdrom_xml(seed_path):
    """The NoCloud seed's drive: a read-only CD-ROM; ``seed_path`` None: an empty tray."""
    cdrom = ET.Element("disk", {"type": "file", "device": "cdrom"})
    _sub(cdrom, "driver", name="qemu", type="raw")
    if seed_path:
        _sub(cdrom, "source", file=seed_path)
    _sub(cdrom, "target", dev="hdc", bus="ide")
    _sub(cdrom, "readonly")
    return cdrom


def with_seed(xml_text, seed_path, instance_id, digest):
    """The domain definition ``xml_text`` with its seed CD-ROM holding ``seed_path`` (None: an
    empty tray) and the metadata naming the seed's ``instance_id`` and ``digest`` (None: no seed)."""
    root = ET.fromstring(xml_text)
    devices = root.find("devices")
    old = next(
        (
            d
            for d in devices.findall("disk")
            if d.get("device") == "cdrom" and d.find("target") is not None and d.find("target").get("dev") == "hdc"
        ),
        None,
    )
    new = seed_cdrom_xml(seed_path)
    if old is None:
        devices.insert(1 + max((i for i, d in enumerate(devices) if d.tag == "disk"), default=-1), new)
    else:
        devices[list(devices).index(old)] = new
    mine = root.find(f"metadata/{{{NAMESPACE}}}vm")
    if mine is not None:
        for name, value in (("instance", instance_id), ("seed", digest)):
            mine.attrib.pop(name, None)
            if value:
                mine.set(name, value)
    return ET.tostring(root, encoding="unicode")


_KIB = {"b": 1 / 1024, "bytes": 1 / 1024, "k": 1, "kib": 1, "kb": 1000 / 1024, "m": 1024, "mib": 1024,
        "mb": 1000**2 / 1024, "g": 1024**2, "gib": 1024**2, "gb": 1000**3 / 1024}  # fmt: skip


def size_of(xml_text):
    """``(vcpus, memory MiB)`` of a domain definition."""
    root = ET.fromstring(xml_text)
    memory = root.find("memory")
    kib = int(memory.text) * _KIB[(memory.get("unit") or "KiB").lower()]
    return int(root.find("vcpu").text), int(kib // 1024)


def with_size(xml_text, vcpus, memory_mib):
    """The domain definition ``xml_text`` with ``vcpus`` and ``memory_mib`` (all of them present
    at boot: no hot-plug ``current`` count, no balloon below the maximum); ValueError for a
    definition whose memory is also laid out elsewhere (NUMA cells, a hot-plug maximum below it)."""
    root = ET.fromstring(xml_text)
    if root.find("cpu/numa") is not None:
        raise ValueError("its memory is split into NUMA cells, which vclmgr does not author")
    limit = root.find("maxMemory")
    if limit is not None and int(limit.text) * _KIB[(limit.get("unit") or "KiB").lower()] < memory_mib * 1024:
        raise ValueError(f"its hot-plug maximum memory is below {memory_mib} MiB")
    vcpu = root.find("vcpu")
    vcpu.text = str(vcpus)
    vcpu.attrib.pop("current", None)
    for tag in ("memory", "currentMemory"):
        element = root.find(tag)
        if element is None:  # libvirt always writes both; a hand-made definition may lack one
            element = ET.SubElement(root, tag)
        element.text, element.attrib = str(memory_mib), {"unit": "MiB"}
    return ET.tostring(root, encoding="unicode")


def user_network_xml(port, guest_port, mac):
    args = ET.Element(f"{{{QEMU_NAMESPACE}}}commandline")
    netdev = f"user,id=vclnet0,restrict=on,hostfwd=tcp:127.0.0.1:{int(port)}-:{int(guest_port)}"
    for value in ("-netdev", netdev, "-device", f"virtio-net-pci,netdev=vclnet0,mac={mac},addr=0x10"):
        ET.SubElement(args, f"{{{QEMU_NAMESPACE}}}arg", {"value": value})
    return args


def interface_xml(network, mac):
    """``bridge:<name>`` attaches to a host bridge; anything else names a libvirt network."""
    if network.startswith("bridge:"):
        nic = ET.Element("interface", {"type": "bridge"})
        _sub(nic, "source", bridge=network.removeprefix("bridge:"))
    else:
        nic = ET.Element("interface", {"type": "network"})
        _sub(nic, "source", network=network)
    _sub(nic, "mac", address=mac)
    _sub(nic, "model", type="virtio")
    return nic


def volume_xml(name, capacity_bytes, fmt, backing_path=None, backing_format=None, allocation_bytes=None):
    """A storage volume; with ``backing_path`` a copy-on-write overlay of that (base) image;
    ``allocation_bytes`` 0: sparse (libvirt otherwise allocates a raw file's whole capacity)."""
    root = ET.Element("volume")
    _sub(root, "name", name)
    _sub(root, "capacity", capacity_bytes, unit="bytes")
    if allocation_bytes is not None:
        _sub(root, "allocation", allocation_bytes, unit="bytes")
    target = _sub(root, "target")
    _sub(target, "format", type=fmt)
    if backing_path:
        backing = _sub(root, "backingStore")
        _sub(backing, "path", backing_path)
        _sub(backing, "format", type=backing_format or fmt)
    return ET.tostring(root, encoding="unicode")


def repathed(xml_text, paths):
    """``xml_text`` (a domain's or a snapshot's) with each file path in ``paths`` replaced by
    the path it maps to (disks, CD-ROMs, backing stores: every ``file`` attribute; the kernel
    and initrd of a direct kernel boot)."""
    root = ET.fromstring(xml_text)
    for element in root.iter():
        path = element.get("file")
        if path in paths:
            element.set("file", paths[path])
        elif element.tag in ("kernel", "initrd") and element.text in paths:
            element.text = paths[element.text]
    return ET.tostring(root, encoding="unicode")


def kernel_boot(xml_text):
    """``{"kernel", "initrd", "cmdline"}`` of a domain that boots a kernel directly (from its
    XML; a snapshot's holds its domain's), or {} when it boots its disk."""
    root = ET.fromstring(xml_text)
    os_ = root.find("os")
    if os_ is None:
        os_ = root.find("domain/os")
    if os_ is None or not os_.findtext("kernel"):
        return {}
    return {name: os_.findtext(name) or "" for name in ("kernel", "initrd", "cmdline")}


def disk_paths(xml_text):
    """The file paths of a domain's disks and CD-ROMs (from its XML), in order."""
    root = ET.fromstring(xml_text)
    return [s.get("file") for s in root.iterfind("devices/disk/source") if s.get("file")]


def networks_of(xml_text):
    """The libvirt networks a domain's NICs are on (from its XML)."""
    root = ET.fromstring(xml_text)
    return {s.get("network") for s in root.iterfind("devices/interface/source") if s.get("network")}


def primary_mac(xml_text, key):
    """The MAC of domain ``key``'s primary NIC (``mac_address``, given to every VM vclmgr
    defines), or None when its XML has no such NIC (a domain defined otherwise): the NIC its
    user logs in through, unlike its NICs on an environment's private networks."""
    mac = mac_address(key)
    for nic in ET.fromstring(xml_text).iterfind("devices/interface/mac"):
        if nic.get("address", "").lower() == mac:
            return mac
    return None


def snapshot_xml(name):
    root = ET.Element("domainsnapshot")
    _sub(root, "name", name)
    _sub(root, "description", "vclmgr snapshot")
    return ET.tostring(root, encoding="unicode")


def metadata_of(xml_text):
    """The vclmgr metadata of a domain's XML as a dict ({} when the domain is not ours)."""
    element = ET.fromstring(xml_text).find(f"metadata/{{{NAMESPACE}}}vm")
    return dict(element.attrib) if element is not None else {}
