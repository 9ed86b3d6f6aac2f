"""libvirt XML of a private network (``base.NetworkSpec``): a pure function, like ``domxml``.

Network rule: a private network routes nowhere. It has no ``<forward>`` element at all, which
libvirt calls an isolated network: libvirt's firewall rules reject whatever the guests send
to be forwarded (to another network, the Internet), so they reach one another and the host,
nothing beyond it. The host itself is not shielded: libvirt accepts DHCP and DNS from the
bridge but drops nothing else addressed to the host, so every service the host listens with on
all its addresses (0.0.0.0, ::) answers the guests at the gateway address, and at the host's
other addresses for a guest that routes them through the gateway. Host services belong on the
management address, or behind an input rule for ``vclbr*`` (docs/admin/hypervisors.md). Its
addresses are an RFC 1918 range (``NetworkSpec.validate``), its DNS domain is answered locally
only and its dnsmasq has no upstream servers, so even a name lookup never leaves the host.

On an overlay (``spec.overlay``: members spread over hosts the operator joined with one), the
network is made on each of those hosts with the same bridge name (it derives from the key) and
the overlay and segment in vclmgr's metadata; the operator's libvirt network hook
(``/etc/libvirt/hooks/network``, given the network's XML when it starts) joins that bridge to
the overlay's segment (a VXLAN of that VNI, a VLAN of that tag): vclmgr never creates host
interfaces. Only the home host's network has an address, DHCP and DNS; the others' are bare
bridges (no dnsmasq), whose guests are served by the home's over the overlay. Still no
``<forward>`` on any of them.
"""

import hashlib
import uuid
import xml.etree.ElementTree as ET

from drivers.libvirt.domxml import NAMESPACE

DNSMASQ_NAMESPACE = "http://libvirt.org/schemas/network/dnsmasq/1.0"
ET.register_namespace("dnsmasq", DNSMASQ_NAMESPACE)
BRIDGE_PREFIX = "vclbr"  # + 10 hex digits: 15 characters, Linux's limit for an interface name
DNS_SUFFIX = "internal"  # the private-use top-level domain: never delegated on the Internet
_UUID_NS = uuid.UUID("0e9b6f5c-2a34-4f7e-9c1d-8b1f3c7d2e45")


def bridge_name(key):
    """The network's Linux bridge: derived from its key, so the same network always gets it."""
    return BRIDGE_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:10]


def dns_domain(key):
    return f"{key.lower()}.{DNS_SUFFIX}"


def network_xml(spec):
    """The definition of the isolated network ``spec`` (validated by the caller)."""
    net = spec.network
    root = ET.Element("network")
    ET.SubElement(root, "name").text = spec.key
    ET.SubElement(root, "uuid").text = str(uuid.uuid5(_UUID_NS, f"{spec.key}/{spec.fingerprint()}"))
    metadata = ET.SubElement(root, "metadata")
    mine = {"key": spec.key, "cidr": str(net), "fingerprint": spec.fingerprint()}
    if spec.overlay:
        mine.update(overlay=spec.overlay, segment=str(spec.segment), home="yes" if spec.home else "no")
    ET.SubElement(metadata, f"{{{NAMESPACE}}}network", mine)
    # No <forward>: isolated (see the module docstring).
    ET.SubElement(root, "bridge", {"name": bridge_name(spec.key), "stp": "on", "delay": "0"})
    if not spec.home:  # a bare bridge: the home host's network serves its addresses and names
        return ET.tostring(root, encoding="unicode")
    ET.SubElement(root, "domain", {"name": dns_domain(spec.key), "localOnly": "yes"})
    dns = ET.SubElement(root, "dns", {"enable": "yes", "forwardPlainNames": "no"})
    for name, _mac, address in spec.addresses():
        host = ET.SubElement(dns, "host", {"ip": address})
        ET.SubElement(host, "hostname").text = name
    ip = ET.SubElement(root, "ip", {"address": spec.gateway, "netmask": str(net.netmask)})
    dhcp = ET.SubElement(ip, "dhcp")
    # The range holds the members' fixed addresses too: libvirt caps dnsmasq's leases
    # (dhcp-lease-max) at the size of the <range>, the <host> entries not counted, so members
    # past a short range would get no lease. dnsmasq never leases a member's address to another
    # NIC: the dynamic addresses are the rest (``spec.dynamic_range()``).
    first, last = net.network_address + 2, net.broadcast_address - 1
    ET.SubElement(dhcp, "range", {"start": str(first), "end": str(last)})
    for name, mac, address in spec.addresses():
        ET.SubElement(dhcp, "host", {"mac": mac, "name": name, "ip": address})
    options = ET.SubElement(root, f"{{{DNSMASQ_NAMESPACE}}}options")
    ET.SubElement(options, f"{{{DNSMASQ_NAMESPACE}}}option", {"value": "no-resolv"})  # no upstream DNS
    return ET.tostring(root, encoding="unicode")


def network_metadata(xml_text):
    """vclmgr's metadata of a network's XML as a dict ({} when the network is not ours)."""
    element = ET.fromstring(xml_text).find(f"metadata/{{{NAMESPACE}}}network")
    return dict(element.attrib) if element is not None else {}


def forward_mode(xml_text):
    """The network's forward mode, or None when it has none (isolated)."""
    forward = ET.fromstring(xml_text).find("forward")
    return None if forward is None else forward.get("mode", "nat")
