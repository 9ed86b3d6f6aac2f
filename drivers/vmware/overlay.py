"""Private networks over an overlay on VMware: distributed port groups on the overlay's switch.

A network spread over hosts of one overlay (``NetworkSpec.overlay``) is one distributed port
group, named by the network's key, on the vSphere Distributed Switch named as the overlay. That
switch is the operator's, as the overlay is on libvirt: made in the datacenter with the
overlay's hosts as members and their uplinks on the network between them (a VLAN trunk, or
NSX). vclmgr never makes or changes a switch: a host that is not a member of one by that name
is refused (``Invalid``: its members would reach nobody on the others). The port group tags
its frames with the network's segment as VLAN id, so each network of the overlay is a
broadcast domain of its own, across every host of the switch; the switch's uplinks carry it
as far as the operator's trunk does, and vclmgr adds no route out. Its description marks it as
vclmgr's (``vclmgr network <key>``): a port group of that name without it, or on another
switch or VLAN, is someone else's and left alone (``Conflict``).

The port group is the datacenter's, but the contract is per host: each host's ``create``
records the network in that host's custom attribute (as ``networks.py`` does, with its range
and fingerprint, which differs per host by ``home``) before it looks for the port group, and
adds it when absent. Each host's ``delete`` forgets its own record, then destroys the port
group once no host of the switch records it and no VM of the datacenter has a NIC on it.
Every host forgets before it looks, so of two hosts ending at once the one that looks last
sees both records gone and removes it: nothing leaks. A create recorded while a delete
destroys the port group finds it gone and adds it again; one that found it just before the
destroy fails its VM's create on the missing port group, and the build's retry makes it anew.
There is no DHCP or DNS on VMware's networks (``networks.py``), so ``home`` changes nothing
here.
"""

from pyVmomi import vim

from drivers import base
from drivers.base import Conflict, Invalid, NetworkInfo
from drivers.vmware import records

MARK = "vclmgr network"
VM_NIC_PROPS = ["name", "runtime.host", "config.hardware.device"]


def _mark(key):
    return f"{MARK} {key}"


def _switches(driver):
    """{name: switch} of the datacenter's distributed switches."""
    found = driver._collect(vim.DistributedVirtualSwitch, ["name"], root=driver._datacenter().networkFolder)
    return {props["name"]: switch for switch, props in found}


def switch_of(driver, spec):
    """The overlay's distributed switch, of which this host is a member; Invalid otherwise."""
    switch = _switches(driver).get(spec.overlay)
    where = f"network {spec.key} on overlay {spec.overlay}"
    if switch is None:
        raise Invalid(
            f"{where}: datacenter {driver._datacenter().name} has no distributed switch named {spec.overlay} "
            "(the operator makes it, with the overlay's hosts and their uplinks)"
        )
    if not is_member(driver, switch):
        raise Invalid(f"{where}: host {driver.host_name} is not a member of distributed switch {spec.overlay}")
    return switch


def is_member(driver, switch, host=None):
    host = host or driver._host()
    members = driver._props(switch, ["summary.hostMember"]).get("summary.hostMember") or []
    return any(member._moId == host._moId for member in members)


def port_groups(driver):
    """{name: (port group, its properties)} of the datacenter's distributed port groups."""
    found = driver._collect(
        vim.dvs.DistributedVirtualPortgroup,
        ["name", "key", "config.description", "config.distributedVirtualSwitch", "config.defaultPortConfig"],
        root=driver._datacenter().networkFolder,
    )
    return {props["name"]: (group, props) for group, props in found}


def ours(props):
    return props.get("config.description", "") == _mark(props["name"])


def vlan_of(props):
    vlan = getattr(props.get("config.defaultPortConfig"), "vlan", None)
    return getattr(vlan, "vlanId", None)


def create(driver, spec):
    """Make (or find) ``spec``'s port group on the overlay's switch, recorded on this host."""
    switch = switch_of(driver, spec)
    entry = {"cidr": str(spec.network), "fingerprint": spec.fingerprint(), "overlay": spec.overlay}
    mine = records.recorded(driver).get(spec.key)
    if mine is not None and mine.get("fingerprint") != spec.fingerprint():
        raise base.network_conflict(spec.key, driver.host_name)
    records.record(driver, spec.key, entry)  # first: a delete on another host now keeps the port group
    try:
        _check(driver, switch, spec)
    except Exception:
        if mine is None:  # recorded by this call: nothing of it is left
            records.record(driver, spec.key, None)
        raise
    return NetworkInfo(spec.key, entry["cidr"])


def _check(driver, switch, spec):
    """Find ``spec``'s port group (made if absent): vclmgr's, on the switch, on its segment."""
    found = port_groups(driver).get(spec.key)
    if found is None:
        _add(driver, switch, spec)
        found = port_groups(driver).get(spec.key)
    if found is None or not ours(found[1]) or found[1]["config.distributedVirtualSwitch"]._moId != switch._moId:
        raise Conflict(f"{base.network_conflict(spec.key, driver.host_name)}: someone else's port group, left alone")
    if vlan_of(found[1]) != spec.segment:
        raise Conflict(
            f"{base.network_conflict(spec.key, driver.host_name)}: its port group is on VLAN {vlan_of(found[1])}, "
            f"not segment {spec.segment}"
        )


def _add(driver, switch, spec):
    setting = vim.dvs.VmwareDistributedVirtualSwitch.VmwarePortConfigPolicy(
        vlan=vim.dvs.VmwareDistributedVirtualSwitch.VlanIdSpec(vlanId=spec.segment, inherited=False)
    )
    group = vim.dvs.DistributedVirtualPortgroup.ConfigSpec(
        name=spec.key,
        description=_mark(spec.key),
        type="earlyBinding",
        numPorts=8,
        autoExpand=True,  # ports as members come, on whichever host of the switch they are
        defaultPortConfig=setting,
    )
    context = f"add port group {spec.key} (VLAN {spec.segment}) on distributed switch {spec.overlay}"
    try:
        driver._wait(driver._call(context, switch.AddDVPortgroup_Task, spec=[group]), context)
    except Conflict:
        pass  # made meanwhile, by another host's create of this network or by someone else: the caller looks


def delete(driver, key, group):
    """This host's part of the overlay network ``key`` (its port group ``group``) goes; the
    port group too once nothing else holds it (see the module docstring)."""
    users = users_on(driver, group, driver._host())
    if users:
        raise Conflict(f"network {key} on {driver.host_name} is still used by {', '.join(users)}")
    records.record(driver, key, None)
    switch = driver._props(group, ["config.distributedVirtualSwitch"])["config.distributedVirtualSwitch"]
    members = driver._props(switch, ["summary.hostMember"]).get("summary.hostMember") or []
    if any(key in records.recorded(driver, host) for host in members) or users_on(driver, group):
        return True
    context = f"remove port group {key} from its distributed switch"
    try:
        driver._wait(driver._call(context, group.Destroy_Task), context)
    except base.NotFound:
        pass  # removed at once by another host's delete
    return True


def users_on(driver, group, host=None):
    """The names of the VMs (of ``host``, or of the datacenter) with a NIC on ``group``."""
    key = driver._props(group, ["key"])["key"]
    found = driver._collect(vim.VirtualMachine, VM_NIC_PROPS, driver._datacenter())
    names = []
    for _vm, props in found:
        if host is not None and getattr(props.get("runtime.host"), "_moId", None) != host._moId:
            continue
        devices = props.get("config.hardware.device") or []
        nics = [d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)]
        if any(getattr(getattr(nic.backing, "port", None), "portgroupKey", None) == key for nic in nics):
            names.append(props["name"])
    return sorted(names)


def listed(driver):
    """This host's overlay networks: recorded here, and their port groups there."""
    groups = port_groups(driver)
    return [
        NetworkInfo(key, entry.get("cidr", ""))
        for key, entry in sorted(records.recorded(driver).items())
        if entry.get("overlay") and key in groups and ours(groups[key][1])
    ]


def reaches(driver, key, host=None):
    """True when ``key`` is vclmgr's distributed port group on a switch ``host`` (this
    driver's by default) is a member of."""
    found = port_groups(driver).get(key)
    if found is None or not ours(found[1]):
        return False
    return is_member(driver, found[1]["config.distributedVirtualSwitch"], host)
