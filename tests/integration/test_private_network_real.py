"""A private network on the tests' own libvirtd (tests/realvm.py): the bridge it makes on this
machine, and that it is gone again after delete. No guest is started.

Network rule: the network is isolated (no ``<forward>``: libvirt routes nothing off the
bridge), its address is a private RFC 1918 range no interface of this machine uses, and nothing
is attached to it but the host's own side of the bridge.
"""

import os

from drivers import registry
from drivers.base import NetworkSpec
from drivers.libvirt import connection, netxml
from tests.realvm import ip_json, unused_range


def test_an_isolated_network_is_a_bridge_with_the_gateway_address_and_goes_with_delete(libvirtd):
    spec = NetworkSpec(f"vclmgr-test-net-{os.getpid()}", unused_range(), (("router", "02:00:00:00:00:01"),))
    bridge = netxml.bridge_name(spec.key)
    driver = registry.get_driver("libvirt", libvirtd.uri)
    try:
        info = driver.create_network(spec)

        assert (info.key, info.cidr) == (spec.key, spec.cidr)
        assert [link["ifname"] for link in ip_json("link", "show", "dev", bridge)] == [bridge]
        addresses = [(a["local"], a["prefixlen"]) for link in ip_json("addr", "show", "dev", bridge)
                     for a in link["addr_info"] if a["family"] == "inet"]  # fmt: skip
        assert addresses == [(spec.gateway, 29)]
        net = driver.conn.networkLookupByName(spec.key)
        assert net.bridgeName() == bridge and netxml.forward_mode(net.XMLDesc(0)) is None

        assert driver.delete_network(spec.key) is True
        assert ip_json("link", "show", "dev", bridge) == []
        assert spec.key not in {n.key for n in driver.list_networks()}
    finally:
        try:
            driver.delete_network(spec.key)
        finally:
            connection.connections.forget(libvirtd.uri)
