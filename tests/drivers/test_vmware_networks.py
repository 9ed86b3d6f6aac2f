"""Private networks on VMware, against vcsim: port groups on a vSwitch with no uplink."""

import dataclasses
import threading

import pytest

from drivers.base import Conflict, Invalid, NetworkInfo, NetworkSpec, NotFound, private_mac
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
    assert (spec.vswitchName, spec.vlanId) == (networks.SWITCH, 0)
    assert lan.key in [n.key for n in driver.list_networks()]
    assert all(n.key != "VM Network" for n in driver.list_networks())  # only vclmgr's
    assert lan.key not in [n.key for n in vmware_peer.target.list_networks()]


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
    tops = {int(networks.mac(f"vcl-{i}", lan.key).split(":")[3], 16) for i in range(500)}
    assert max(tops) == 0x3F and min(tops) == 0  # the whole range, never past it


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


def test_networks_made_at_once_on_one_host_are_all_recorded(vmware_peer):
    driver = vmware_peer.source
    specs = [NetworkSpec(f"env-{next_key()}-n{i}", f"10.210.{i}.0/24") for i in range(4)]
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
    finally:
        for spec in specs:
            driver.delete_network(spec.key)
    assert not set(networks.recorded(driver)) & {spec.key for spec in specs}
