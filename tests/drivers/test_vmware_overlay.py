"""Private networks over an overlay on VMware, against vcsim: one distributed port group on
the overlay's distributed switch (the operator's, made here through pyVmomi with the cluster's
hosts: vcsim takes a VM's NIC on one only when every host of the VM's cluster is a member),
VLAN = the network's segment, shared by the VMs of both hosts, removed when the last host lets
it go. The switch and the VMs are read back through pyVmomi."""

import dataclasses

import pytest
from pyVmomi import vim

from drivers.base import Conflict, Invalid, NetworkInfo, NetworkSpec
from drivers.vmware import records
from tests.drivers.conftest import next_key
from tests.vcsim import distributed_switch, remove_switch

pytestmark = pytest.mark.slow  # starts vcsim (once per session and worker)


@pytest.fixture
def dvs(vcsim):
    """The overlay's distributed switch: the cluster's hosts, not the standalone one."""
    switch = distributed_switch(vcsim, f"ovl-{next_key()}")
    yield switch
    remove_switch(vcsim, switch)


@pytest.fixture
def lan(dvs):
    key = f"env-{next_key()}-lan"
    return NetworkSpec(key, "10.203.0.0/24", (("router", "00:50:56:00:00:01"),), dvs.name, 7, True)


def standalone(vcsim):
    return vcsim.driver(next(h["name"] for h in vcsim.hosts if "_C" not in h["name"]))


def groups_of(switch):
    """Port group name → (VLAN id, description) on ``switch``, as vSphere has them."""
    return {
        g.name: (g.config.defaultPortConfig.vlan.vlanId, g.config.description)
        for g in switch.portgroup
        if "-DVUplinks" not in g.name
    }


def member_vm(peer, driver, key):
    driver.stage_image(peer.image)
    vm_key = next_key()
    driver.create(peer.spec(vm_key, private_networks=((key, driver.private_mac(vm_key, key)),)))
    return vm_key


def dvs_nics(driver, vm_key):
    """Port group key → MAC of the VM's NICs on a distributed switch."""
    vm = driver._vm(vm_key)
    return {
        d.backing.port.portgroupKey: d.macAddress
        for d in vm.config.hardware.device
        if isinstance(d, vim.vm.device.VirtualEthernetCard) and hasattr(d.backing, "port")
    }


def test_a_network_on_an_overlay_is_one_distributed_port_group_both_hosts_put_vms_on(vmware_peer, dvs, lan):
    source, target = vmware_peer.source, vmware_peer.target
    on_target = dataclasses.replace(lan, home=False)  # the other host's spec: not its home

    assert source.create_network(lan) == NetworkInfo(lan.key, "10.203.0.0/24")
    assert target.create_network(on_target) == source.create_network(lan)  # found, and again: idempotent
    assert groups_of(dvs)[lan.key] == (7, f"vclmgr network {lan.key}")  # VLAN = the segment
    assert [g.name for g in dvs.portgroup].count(lan.key) == 1
    assert lan.key in [n.key for n in source.list_networks()] and lan.key in [n.key for n in target.list_networks()]
    group = next(g for g in dvs.portgroup if g.name == lan.key)

    first, second = member_vm(vmware_peer, source, lan.key), member_vm(vmware_peer, target, lan.key)
    assert dvs_nics(source, first) == {group.key: source.private_mac(first, lan.key)}
    assert dvs_nics(target, second) == {group.key: target.private_mac(second, lan.key)}
    assert {source._vm(first).runtime.host.name, target._vm(second).runtime.host.name} == {
        source.host_name,
        target.host_name,
    }

    with pytest.raises(Conflict, match=f"still used by {first}"):
        source.delete_network(lan.key)
    source.destroy(first)
    assert source.delete_network(lan.key) is True  # this host's part: the target still holds it
    assert lan.key in groups_of(dvs) and lan.key not in records.recorded(source)
    assert lan.key not in [n.key for n in source.list_networks()]
    target.destroy(second)
    assert target.delete_network(lan.key) is True  # the last: the port group goes
    assert lan.key not in groups_of(dvs)
    assert lan.key not in records.recorded(target)
    assert target.delete_network(lan.key) is False


def test_a_host_off_the_switch_or_an_overlay_with_no_switch_is_refused(vmware_peer, vcsim, dvs, lan):
    third = standalone(vcsim)

    with pytest.raises(Invalid, match=f"host {third.host_name} is not a member of distributed switch {dvs.name}"):
        third.create_network(lan)
    with pytest.raises(Invalid, match="has no distributed switch named nowhere"):
        vmware_peer.source.create_network(dataclasses.replace(lan, overlay="nowhere"))
    assert lan.key not in groups_of(dvs) and lan.key not in records.recorded(third)


def test_someone_elses_port_group_or_another_segment_is_a_conflict(vmware_peer, dvs, lan):
    driver = vmware_peer.source
    theirs = vim.dvs.DistributedVirtualPortgroup.ConfigSpec(name=lan.key, type="earlyBinding", numPorts=1)
    driver._wait(dvs.AddDVPortgroup_Task(spec=[theirs]), "add theirs")
    try:
        with pytest.raises(Conflict, match="someone else's port group, left alone"):
            driver.create_network(lan)
        assert lan.key not in records.recorded(driver)
    finally:
        driver._wait(next(g for g in dvs.portgroup if g.name == lan.key).Destroy_Task(), "destroy theirs")

    driver.create_network(lan)
    other_segment = dataclasses.replace(lan, segment=9)
    with pytest.raises(Conflict):  # another fingerprint under the same key on this host
        driver.create_network(other_segment)
    with pytest.raises(Conflict, match="on VLAN 7, not segment 9"):
        vmware_peer.target.create_network(dataclasses.replace(other_segment, home=False))
    assert driver.delete_network(lan.key) is True
    assert lan.key not in groups_of(dvs)


def test_a_vm_on_an_overlay_network_moves_only_to_a_host_of_the_switch(vmware_peer, vcsim, dvs, lan):
    source, target = vmware_peer.source, vmware_peer.target
    third = standalone(vcsim)
    source.create_network(lan)
    key = member_vm(vmware_peer, source, lan.key)

    with pytest.raises(Conflict, match=f"whose distributed switch {third.host_name} is not a member of"):
        source.migrate(key, third)
    target.create_network(dataclasses.replace(lan, home=False))
    source.migrate(key, target)
    assert source._vm(key).runtime.host.name == target.host_name
    target.destroy(key)
    source.delete_network(lan.key)
    target.delete_network(lan.key)
    assert lan.key not in groups_of(dvs)
