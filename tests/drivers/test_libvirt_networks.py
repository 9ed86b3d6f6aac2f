"""Private networks on libvirt: the XML checked against libvirt's own schemas, the calls
against libvirt's test driver (node files in tests/data/libvirt)."""

import dataclasses
import xml.etree.ElementTree as ET

import pytest

from drivers.base import Conflict, NetworkInfo, NetworkSpec, NotFound, private_mac
from drivers.libvirt import domxml, netxml  # pure XML: do not import libvirt
from tests.drivers.conftest import valid_for_libvirt

LAN = NetworkSpec("env12-lan", "10.201.0.0/24", (("router", "02:00:00:00:00:01"), ("client1", "02:00:00:00:00:02")))


def test_a_private_network_is_isolated_with_fixed_addresses_and_names(tmp_path):
    xml_text = netxml.network_xml(LAN)
    root = ET.fromstring(xml_text)

    valid_for_libvirt(tmp_path, xml_text, "network")
    assert root.find("forward") is None and netxml.forward_mode(xml_text) is None
    bridge = root.find("bridge").get("name")
    assert len(bridge) <= 15 and bridge == netxml.bridge_name("env12-lan") != netxml.bridge_name("env13-lan")
    ip = root.find("ip")
    assert (ip.get("address"), ip.get("netmask")) == ("10.201.0.1", "255.255.255.0")
    assert [h.attrib for h in ip.iterfind("dhcp/host")] == [
        {"mac": "02:00:00:00:00:01", "name": "router", "ip": "10.201.0.2"},
        {"mac": "02:00:00:00:00:02", "name": "client1", "ip": "10.201.0.3"},
    ]
    # The members' addresses inside the range, so libvirt's lease limit counts them.
    assert ip.find("dhcp/range").attrib == {"start": "10.201.0.2", "end": "10.201.0.254"}
    assert [(h.get("ip"), h.findtext("hostname")) for h in root.iterfind("dns/host")] == [
        ("10.201.0.2", "router"),
        ("10.201.0.3", "client1"),
    ]
    assert root.find("domain").attrib == {"name": "env12-lan.internal", "localOnly": "yes"}
    assert root.find("dns").get("forwardPlainNames") == "no"
    options = [o.get("value") for o in root.iter(f"{{{netxml.DNSMASQ_NAMESPACE}}}option")]
    assert options == ["no-resolv"]
    assert netxml.network_metadata(xml_text) == {
        "key": "env12-lan",
        "cidr": "10.201.0.0/24",
        "fingerprint": LAN.fingerprint(),
    }


def test_a_network_of_only_fixed_members_leases_their_addresses_only(tmp_path):
    full = NetworkSpec("env1-lan", "192.168.9.0/29", tuple((f"h{i}", f"02:00:00:00:00:0{i}") for i in range(5)))
    xml_text = netxml.network_xml(full)

    valid_for_libvirt(tmp_path, xml_text, "network")
    assert full.dynamic_range() is None
    assert ET.fromstring(xml_text).find("ip/dhcp/range").attrib == {"start": "192.168.9.2", "end": "192.168.9.6"}


def test_a_vm_gets_one_virtio_nic_per_private_network_after_the_primary_one(tmp_path, libvirt_peer):
    spec = libvirt_peer.spec()
    nics = ((LAN.key, private_mac(spec.key, LAN.key)), ("env12-dmz", private_mac(spec.key, "env12-dmz")))
    spec = dataclasses.replace(spec, private_networks=nics)
    xml_text = domxml.domain_xml(spec, domain_type="kvm", disk_path="/images/vcl-9.qcow2")

    valid_for_libvirt(tmp_path, xml_text, "domain")
    found = [
        (
            nic.get("type"),
            nic.find("source").get("network"),
            nic.find("mac").get("address"),
            nic.find("model").get("type"),
        )  # noqa: E501
        for nic in ET.fromstring(xml_text).iterfind("devices/interface")
    ]
    assert found == [
        ("network", "default", domxml.mac_address(spec.key), "virtio"),
        ("network", "env12-lan", nics[0][1], "virtio"),
        ("network", "env12-dmz", nics[1][1], "virtio"),
    ]
    assert domxml.networks_of(xml_text) == {"default", "env12-lan", "env12-dmz"}
    # Its address (the one its user logs in at) is the primary NIC's only.
    assert domxml.primary_mac(xml_text, spec.key) == domxml.mac_address(spec.key)
    assert domxml.primary_mac(xml_text, "vcl-other") is None  # a domain defined otherwise: any NIC's


def test_create_is_idempotent_and_list_shows_only_vclmgrs_networks(libvirt_peer):
    driver = libvirt_peer.source
    before = {n.name() for n in driver.conn.listAllNetworks()}

    first = driver.create_network(LAN)
    second = driver.create_network(LAN)

    assert first == second == NetworkInfo("env12-lan", "10.201.0.0/24", True)
    assert driver.list_networks() == [first]  # the node's own networks are not vclmgr's
    assert before and "env12-lan" not in before
    net = driver.conn.networkLookupByName("env12-lan")
    assert net.isActive() and net.autostart()
    assert netxml.forward_mode(net.XMLDesc(0)) is None
    assert not libvirt_peer.target.list_networks()  # one host's network is not another's


def test_a_network_another_member_starts_meanwhile_counts_as_started(libvirt_peer, monkeypatch):
    import libvirt

    driver = libvirt_peer.source
    driver.create_network(LAN)
    driver.conn.networkLookupByName(LAN.key).destroy()
    is_active, raced = libvirt.virNetwork.isActive, []

    def seen_just_before_another_build_starts_it(net):
        answer = is_active(net)
        if not answer and not raced:  # the environment's members are built at once
            raced.append(net.create())
        return answer

    monkeypatch.setattr(libvirt.virNetwork, "isActive", seen_just_before_another_build_starts_it)

    assert driver.create_network(LAN) == NetworkInfo("env12-lan", "10.201.0.0/24", True)
    assert raced and is_active(driver.conn.networkLookupByName(LAN.key))


def test_another_spec_under_the_same_key_is_a_conflict(libvirt_peer):
    driver = libvirt_peer.source
    driver.create_network(LAN)

    with pytest.raises(Conflict) as caught:
        driver.create_network(dataclasses.replace(LAN, cidr="10.202.0.0/24"))

    assert caught.value.permanent and driver.list_networks()[0].cidr == "10.201.0.0/24"


def test_a_network_vclmgr_did_not_make_is_neither_adopted_nor_deleted(libvirt_peer):
    driver = libvirt_peer.source
    foreign = driver.conn.listAllNetworks()[0].name()

    with pytest.raises(Conflict):
        driver.create_network(dataclasses.replace(LAN, key=foreign))
    with pytest.raises(Conflict, match="not made by vclmgr"):
        driver.delete_network(foreign)
    assert driver.conn.networkLookupByName(foreign)


def test_delete_removes_the_network_once(libvirt_peer):
    driver = libvirt_peer.source
    driver.create_network(LAN)

    assert driver.delete_network("env12-lan") is True
    assert driver.delete_network("env12-lan") is False
    assert driver.list_networks() == []
    assert "env12-lan" not in {n.name() for n in driver.conn.listAllNetworks()}


def test_a_member_vm_is_defined_with_its_nics_and_holds_the_network(libvirt_peer):
    driver = libvirt_peer.source
    driver.stage_image(libvirt_peer.image)
    driver.create_network(LAN)
    spec = libvirt_peer.spec()
    spec = dataclasses.replace(spec, private_networks=((LAN.key, private_mac(spec.key, LAN.key)),))

    driver.create(spec)
    driver.start(spec.key)

    defined = driver.conn.lookupByName(spec.key).XMLDesc(0)
    macs = {nic.find("source").get("network"): nic.find("mac").get("address")
            for nic in ET.fromstring(defined).iterfind("devices/interface")}  # fmt: skip
    assert macs["env12-lan"] == spec.private_networks[0][1]
    with pytest.raises(Conflict, match=f"still used by {spec.key}"):
        driver.delete_network("env12-lan")
    driver.destroy(spec.key)
    assert driver.delete_network("env12-lan") is True


def test_a_vm_on_a_private_network_the_host_lacks_is_not_created(libvirt_peer):
    driver = libvirt_peer.source
    driver.stage_image(libvirt_peer.image)
    libvirt_peer.target.create_network(LAN)  # on the other host only
    spec = libvirt_peer.spec()
    spec = dataclasses.replace(spec, private_networks=((LAN.key, private_mac(spec.key, LAN.key)),))

    with pytest.raises(NotFound, match="no private network env12-lan") as caught:
        driver.create(spec)

    assert caught.value.permanent and spec.key not in [vm.key for vm in driver.list_vms()]


def overlay(home):
    return dataclasses.replace(LAN, overlay="vxlan-lab", segment=42, home=home)


def test_a_network_on_an_overlay_serves_addresses_on_its_home_host_only(tmp_path):
    home, other = netxml.network_xml(overlay(True)), netxml.network_xml(overlay(False))
    for xml_text in (home, other):
        valid_for_libvirt(tmp_path, xml_text, "network")
        root = ET.fromstring(xml_text)
        assert root.find("forward") is None  # isolated on every host: the overlay is its only way out
        # One bridge name on every host: the operator's network hook joins it to the segment.
        assert root.find("bridge").get("name") == netxml.bridge_name("env12-lan")
    assert ET.fromstring(home).find("ip/dhcp") is not None
    bare = ET.fromstring(other)
    assert bare.find("ip") is None and bare.find("dns") is None and bare.find("domain") is None
    assert netxml.network_metadata(other) == {
        "key": "env12-lan",
        "cidr": "10.201.0.0/24",
        "fingerprint": overlay(False).fingerprint(),
        "overlay": "vxlan-lab",
        "segment": "42",
        "home": "no",
    }
    assert overlay(True).fingerprint() != LAN.fingerprint() != overlay(False).fingerprint()


def test_an_overlay_network_is_made_on_each_of_its_hosts(libvirt_peer):
    """Against libvirt's test driver: the home host's network and the bare one both define and
    start; neither routes anywhere."""
    made = {}
    for driver, home in ((libvirt_peer.source, True), (libvirt_peer.target, False)):
        assert driver.create_network(overlay(home)) == NetworkInfo("env12-lan", "10.201.0.0/24", True)
        assert driver.create_network(overlay(home)).key == "env12-lan"  # idempotent
        net = driver.conn.networkLookupByName("env12-lan")
        assert net.isActive() and netxml.forward_mode(net.XMLDesc(0)) is None
        made[home] = netxml.network_metadata(net.XMLDesc(0))
    assert made[True]["home"] == "yes" and made[False]["home"] == "no" and made[False]["segment"] == "42"


def test_an_overlay_needs_its_segment():
    from drivers.base import Invalid

    with pytest.raises(Invalid, match="an overlay needs a segment"):
        dataclasses.replace(LAN, overlay="vxlan-lab").validate()
    with pytest.raises(Invalid, match="only a network on an overlay"):
        dataclasses.replace(LAN, home=False).validate()
