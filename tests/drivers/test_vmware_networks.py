"""Private networks on VMware, against vcsim: port groups on a vSwitch with no uplink."""

import dataclasses
import threading

import pytest

from drivers.base import Conflict, DriverError, Invalid, NetworkInfo, NetworkSpec, NotFound, private_mac
from drivers.vmware import networks
from tests.drivers.conftest import next_key

pytestmark = pytest.mark.slow  # starts vcsim (once per session and worker)


@pytest.fixture
def lan(vmware_peer):
    """A network key unique in this session (vcsim lives for all of it), removed afterwards."""
    key = f"env-{next_key()}-lan"
    yield NetworkSpec(key, "10.201.0.0/24", (("router", "02:00:00:00:00:01"),))
    for driver in (vmware_peer.source, vmware_peer.target):
        for name in networks._users(driver, key):
            driver.destroy(name)
        driver.delete_network(key)


def switch_of(driver):
    info = driver._props(driver._host().configManager.networkSystem, ["networkInfo"])["networkInfo"]
    return next(s for s in info.vswitch if s.name == networks.SWITCH)


def port_group(driver, key):
    info = driver._props(driver._host().configManager.networkSystem, ["networkInfo"])["networkInfo"]
    return next(pg.spec for pg in info.portgroup if pg.spec.name == key)


def test_a_private_network_is_a_port_group_on_a_switch_without_uplink(vmware_peer, lan):
    driver = vmware_peer.source

    info = driver.create_network(lan)

    assert info == driver.create_network(lan) == NetworkInfo(lan.key, "10.201.0.0/24", True)
    assert lan.key in switch_of(driver).portgroup
    assert not switch_of(driver).pnic and not getattr(switch_of(driver).spec, "bridge", None)
    spec = port_group(driver, lan.key)
    assert spec.vswitchName == networks.SWITCH and spec.vlanId in networks.VLANS
    assert lan.key in [n.key for n in driver.list_networks()]
    assert all(n.key != "VM Network" for n in driver.list_networks())  # only vclmgr's
    assert lan.key not in [n.key for n in vmware_peer.target.list_networks()]


def test_each_network_gets_a_vlan_of_its_own_on_the_switch(vmware_peer, lan):
    # One switch forwards between all its ports of a VLAN, whatever their port group: without
    # VLANs of their own, two environments' networks on a host would be one broadcast domain.
    driver = vmware_peer.source
    other = dataclasses.replace(lan, key=f"{lan.key}-2", cidr="10.202.0.0/24")
    try:
        driver.create_network(lan)
        driver.create_network(other)
        driver.create_network(lan)  # again: it keeps its VLAN

        first, second = port_group(driver, lan.key).vlanId, port_group(driver, other.key).vlanId
        assert first != second and {first, second} <= set(networks.VLANS)
        assert networks.vlans(driver)[lan.key] == first
    finally:
        driver.delete_network(other.key)


def test_a_network_sharing_its_vlan_is_not_handed_out(vmware_peer, lan):
    # What a create sees before a concurrent one has moved its new port group to a free VLAN.
    driver = vmware_peer.source
    driver.create_network(lan)
    ns = driver._host().configManager.networkSystem
    newcomer = f"{lan.key}-new"
    group = networks.vim.host.PortGroup.Specification(
        name=newcomer,
        vlanId=port_group(driver, lan.key).vlanId,
        vswitchName=networks.SWITCH,
        policy=networks.vim.host.NetworkPolicy(),
    )
    ns.AddPortGroup(portgrp=group)
    try:
        with pytest.raises(DriverError, match=f"shares its VLAN with {newcomer}") as caught:
            driver.create_network(lan)
        assert not caught.value.permanent
    finally:
        ns.RemovePortGroup(pgName=newcomer)
    assert driver.create_network(lan).key == lan.key


def test_a_port_group_that_picked_a_vlan_another_took_meanwhile_moves_to_a_free_one(vmware_peer, lan, monkeypatch):
    # Another worker adds its port group on the VLAN this create picked, between the pick and
    # the add (played here by adding it right before this create's add, straight to vcsim).
    driver = vmware_peer.source
    ns = driver._host().configManager.networkSystem
    rival = f"{lan.key}-rival"
    call = driver._call

    def with_a_rival(context, fn, *args, **kwargs):
        if context.startswith(f"add port group {lan.key} ") and rival not in networks.vlans(driver):
            group = networks.vim.host.PortGroup.Specification(
                name=rival,
                vlanId=kwargs["portgrp"].vlanId,
                vswitchName=networks.SWITCH,
                policy=networks.vim.host.NetworkPolicy(),
            )
            ns.AddPortGroup(portgrp=group)
        return call(context, fn, *args, **kwargs)

    monkeypatch.setattr(driver, "_call", with_a_rival)
    try:
        driver.create_network(lan)

        made = networks.vlans(driver)
        assert made[lan.key] != made[rival] and made[lan.key] in networks.VLANS
    finally:
        if rival in networks.vlans(driver):
            ns.RemovePortGroup(pgName=rival)


def test_a_name_taken_elsewhere_in_the_datacenter_leaves_nothing_behind(vmware_peer, lan):
    source, target = vmware_peer.source, vmware_peer.target
    ns = target._host().configManager.networkSystem
    group = networks.vim.host.PortGroup.Specification(
        name=lan.key, vlanId=0, vswitchName="vSwitch0", policy=networks.vim.host.NetworkPolicy()
    )
    ns.AddPortGroup(portgrp=group)  # someone else's, on another host
    try:
        with pytest.raises(Conflict, match=f"{lan.key} already exists on {source.host_name}.*elsewhere"):
            source.create_network(lan)
        assert lan.key not in networks.layout(source)[0]
        assert lan.key not in networks.recorded(source)  # its record went with it
    finally:
        ns.RemovePortGroup(pgName=lan.key)


def test_another_spec_under_the_same_key_is_a_conflict(vmware_peer, lan):
    vmware_peer.source.create_network(lan)

    with pytest.raises(Conflict) as caught:
        vmware_peer.source.create_network(dataclasses.replace(lan, cidr="10.202.0.0/24"))

    assert caught.value.permanent


def test_a_port_group_vclmgr_did_not_make_is_left_alone(vmware_peer, lan):
    driver = vmware_peer.source
    ns = driver._host().configManager.networkSystem
    group = networks.vim.host.PortGroup.Specification(
        name=lan.key, vlanId=0, vswitchName="vSwitch0", policy=networks.vim.host.NetworkPolicy()
    )
    ns.AddPortGroup(portgrp=group)  # someone else's, on the uplinked switch
    try:
        with pytest.raises(Conflict):
            driver.create_network(lan)
        with pytest.raises(Conflict, match="not made by vclmgr"):
            driver.delete_network(lan.key)
        assert networks.layout(driver)[0][lan.key] == "vSwitch0"
    finally:
        ns.RemovePortGroup(pgName=lan.key)


def test_a_member_gets_a_vmxnet3_nic_on_its_mac_and_holds_the_network(vmware_peer, lan):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    driver.create_network(lan)
    spec = vmware_peer.spec()
    spec = dataclasses.replace(spec, private_networks=((lan.key, driver.private_mac(spec.key, lan.key)),))

    driver.create(spec)

    devices = driver._props(driver._vm(spec.key), ["config.hardware.device"])["config.hardware.device"]
    nics = [d for d in devices if isinstance(d, networks.vim.vm.device.VirtualEthernetCard)]
    private = [n for n in nics if getattr(n.backing, "deviceName", None) == lan.key]
    assert len(nics) == 2 and len(private) == 1
    assert isinstance(private[0], networks.vim.vm.device.VirtualVmxnet3)
    assert private[0].macAddress == spec.private_networks[0][1]
    with pytest.raises(Conflict, match=f"still used by {spec.key}"):
        driver.delete_network(lan.key)
    driver.destroy(spec.key)
    assert driver.delete_network(lan.key) is True
    assert driver.delete_network(lan.key) is False
    assert lan.key not in switch_of(driver).portgroup


def test_a_vm_on_a_network_its_host_lacks_is_refused(vmware_peer, lan):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    spec = vmware_peer.spec()
    spec = dataclasses.replace(spec, private_networks=((lan.key, driver.private_mac(spec.key, lan.key)),))

    with pytest.raises(NotFound, match=f"no private network {lan.key}"):
        driver.create(spec)

    assert spec.key not in [vm.key for vm in driver.list_vms()]


def test_a_member_cloned_from_a_template_gets_its_private_nic_too(vmware_peer, lan):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    golden = vmware_peer.spec()
    driver.create(golden)
    template = driver.capture(golden.key, f"golden-{golden.key}")
    driver.create_network(lan)
    spec = vmware_peer.spec(image=template)
    spec = dataclasses.replace(spec, private_networks=((lan.key, driver.private_mac(spec.key, lan.key)),))

    driver.create(spec)

    devices = driver._props(driver._vm(spec.key), ["config.hardware.device"])["config.hardware.device"]
    macs = {
        d.backing.deviceName: d.macAddress for d in devices if isinstance(d, networks.vim.vm.device.VirtualEthernetCard)
    }
    assert macs[lan.key] == spec.private_networks[0][1] and len(macs) == 2


def test_a_private_nic_gets_a_stable_mac_in_vmwares_static_range(vmware_peer, lan):
    driver = vmware_peer.source
    spec = vmware_peer.spec()
    address = driver.private_mac(spec.key, lan.key)
    assert address == driver.private_mac(spec.key, lan.key) != driver.private_mac(spec.key, "env-other-lan")
    assert address.startswith("00:50:56:") and int(address.split(":")[3], 16) <= 0x3F
    # A fixed network key (the fixture's changes with the test order): the same 2,000 MACs
    # every run, so their spread over the range is a fact of the derivation, not of luck.
    tops = {int(networks.mac(f"vcl-{i}", "env-vcl-1-lan").split(":")[3], 16) for i in range(2000)}
    assert tops == set(range(0x40))  # the whole range, never past it


def test_a_private_mac_outside_vmwares_static_range_is_refused_before_anything_is_made(vmware_peer, lan):
    driver = vmware_peer.source
    driver.stage_image(vmware_peer.image)
    driver.create_network(lan)
    spec = vmware_peer.spec()
    for address in (private_mac(spec.key, lan.key), "00:50:56:40:00:01"):
        wrong = dataclasses.replace(spec, private_networks=((lan.key, address),))
        with pytest.raises(Invalid, match="outside VMware's static range"):
            driver.create(wrong)
    assert spec.key not in [vm.key for vm in driver.list_vms()]


def test_networks_made_at_once_on_one_host_are_all_recorded_each_on_its_own_vlan(vmware_peer):
    driver = vmware_peer.source
    specs = [NetworkSpec(f"env-{next_key()}-n{i}", f"10.210.{i}.0/24") for i in range(6)]
    errors = []

    def make(spec):
        try:
            driver.create_network(spec)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(spec,)) for spec in specs]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors
        record = networks.recorded(driver)
        assert {spec.key: record[spec.key]["cidr"] for spec in specs} == {spec.key: str(spec.network) for spec in specs}
        made = networks.vlans(driver)
        assert len({made[spec.key] for spec in specs}) == len(specs)
    finally:
        for spec in specs:
            driver.delete_network(spec.key)
    assert not set(networks.recorded(driver)) & {spec.key for spec in specs}
