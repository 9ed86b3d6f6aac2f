"""Private networks on a VMware host: port groups on a standard vSwitch with no uplink.

Network rule: the vSwitch ``vclmgr-private`` is made without any physical NIC (no bridge in
its specification), so nothing sent on it leaves the host. A port group alone parts nothing: a
standard vSwitch forwards between all its ports of one VLAN, whichever port group they are in.
So each network's port group gets a VLAN id of its own on that switch (the lowest free one,
1–4094), and a frame sent on it reaches only the VMs of that port group. A port group is named
by the network's key. Two port groups made at the same instant (two workers) may pick one VLAN:
each create reads the switch back after adding, and one that finds another port group on its
VLAN is removed and added again on a free one before it is returned (unless a VM is on it
already). Of two that share a VLAN, the one added second always sees the first and no VM is on
it yet, so it moves; a create of an existing network that finds its VLAN shared (the newcomer
not moved yet) is a temporary error. Port groups made with VLAN 0
(before VLANs were given) are left as they are until their environment ends.

vSphere keeps no address range on a port group: each network's range and fingerprint are
recorded on its host (``records.py``; private networks need vCenter). DHCP and DNS are not
provided here: the members' guests configure their addresses themselves.

A network on an overlay (``NetworkSpec.overlay``: members spread over hosts the operator joined
with one) is a distributed port group instead (``overlay.py``); ``create``, ``delete``,
``listed``, ``check_on_host`` and ``check_move`` take both kinds.

A NIC's static MAC on ESXi must lie in VMware's manual range, 00:50:56:00:00:00 to
00:50:56:3f:ff:ff: ``mac`` gives a private NIC's there (stable per VM and network, as
``base.private_mac``), and a ``VMSpec`` with a private MAC outside it is refused.
"""

import contextlib
import hashlib

from pyVmomi import vim

from drivers import base
from drivers.base import Conflict, DriverError, Invalid, NetworkInfo, NotFound
from drivers.vmware import overlay
from drivers.vmware.records import RECORD_TRIES, record, recorded

SWITCH = "vclmgr-private"
SWITCH_PORTS = 128
VLANS = range(1, 4095)  # 0 is untagged, 4095 a trunk that sees every VLAN
#: ESXi takes a static MAC only under VMware's prefix with the next bits 00: 22 bits free.
MANUAL_PREFIX = "00:50:56"
MANUAL_TOP = 0x3F


def mac(vm_key, network_key):
    """The MAC of VM ``vm_key``'s NIC on private network ``network_key`` in VMware's manual
    range (ESXi refuses any other static MAC): stable, derived as ``base.private_mac`` is."""
    digest = hashlib.sha256(f"{vm_key}/{network_key}".encode()).digest()
    return f"{MANUAL_PREFIX}:{digest[0] & MANUAL_TOP:02x}:{digest[1]:02x}:{digest[2]:02x}"


def check_macs(spec):
    """Invalid unless each private NIC of ``spec`` has a MAC ESXi accepts as static."""
    for key, address in spec.private_networks:
        prefix, rest = address[:8], address[9:]
        if prefix != MANUAL_PREFIX or int(rest[:2], 16) > MANUAL_TOP:
            raise Invalid(
                f"{spec.key}: MAC {address} on {key} is outside VMware's static range "
                f"{MANUAL_PREFIX}:00:00:00 to {MANUAL_PREFIX}:3f:ff:ff (the driver's private_mac gives one)"
            )


def _network_info(driver):
    return driver._props(driver._host().configManager.networkSystem, ["networkInfo"]).get("networkInfo")


def layout(driver):
    """``{port group name: vSwitch name}`` of the driver's host, and its vSwitches' names."""
    info = _network_info(driver)
    groups = {}
    for switch in getattr(info, "vswitch", None) or []:
        for name in switch.portgroup or []:  # vcsim lists names, vSphere keys (key-vim.host.PortGroup-<name>)
            groups[str(name).removeprefix("key-vim.host.PortGroup-")] = switch.name
    return groups, {switch.name for switch in getattr(info, "vswitch", None) or []}


def vlans(driver):
    """``{port group name: VLAN id}`` of the port groups on vclmgr's switch."""
    info = _network_info(driver)
    return {
        pg.spec.name: pg.spec.vlanId for pg in getattr(info, "portgroup", None) or [] if pg.spec.vswitchName == SWITCH
    }


def _free_vlan(driver):
    taken = set(vlans(driver).values())
    vlan = next((v for v in VLANS if v not in taken), None)
    if vlan is None:
        raise Conflict(f"{driver.host_name}: every VLAN of vSwitch {SWITCH} is taken; end an environment first")
    return vlan


def _sharing(driver, key):
    """Another port group of vclmgr's switch on ``key``'s VLAN (not 0: untagged ones are older
    networks), or None."""
    found = vlans(driver)
    vlan = found.get(key)
    return next((name for name, v in sorted(found.items()) if name != key and v == vlan and vlan), None)


def create(driver, spec):
    spec.validate()
    if spec.overlay:
        return overlay.create(driver, spec)
    groups, switches = layout(driver)
    if spec.key not in groups:
        _add(driver, spec, switches)
        groups, _ = layout(driver)
    mine = recorded(driver).get(spec.key, {})
    if groups.get(spec.key) != SWITCH:
        where = f"on vSwitch {groups[spec.key]}" if spec.key in groups else "elsewhere in the datacenter"
        raise Conflict(f"{base.network_conflict(spec.key, driver.host_name)}: a port group {where}, left alone")
    if mine.get("fingerprint") != spec.fingerprint():
        raise base.network_conflict(spec.key, driver.host_name)
    other = _sharing(driver, spec.key)
    if other:
        raise DriverError(
            f"network {spec.key} on {driver.host_name} shares its VLAN with {other}, which is being moved; try again",
            permanent=False,
        )
    return NetworkInfo(spec.key, mine["cidr"])


def _add(driver, spec, switches):
    """Make ``spec``'s port group on a VLAN of its own, recorded first (so a concurrent create
    of the same key sees its fingerprint). Nothing is left half made: when the port group is
    not made (or not on vclmgr's switch), its record goes."""
    ns = driver._host().configManager.networkSystem
    if SWITCH not in switches:
        try:  # no bridge: the switch has no uplink
            driver._call(
                f"add vSwitch {SWITCH} on {driver.host_name}",
                ns.AddVirtualSwitch,
                vswitchName=SWITCH,
                spec=vim.host.VirtualSwitch.Specification(numPorts=SWITCH_PORTS),
            )
        except Conflict:
            pass  # made by a concurrent call meanwhile
    record(driver, spec.key, {"cidr": str(spec.network), "fingerprint": spec.fingerprint()})
    try:
        _add_group(driver, ns, spec.key)
    except Exception as exc:
        if isinstance(exc, Conflict) and layout(driver)[0].get(spec.key) == SWITCH:
            return  # a concurrent create of this key made it: the caller judges whose it is
        record(driver, spec.key, None)
        if not (isinstance(exc, Conflict) and find(driver, spec.key) is not None):
            raise
        # someone else's network of that name: the caller says so


def _add_group(driver, ns, key):
    """Add port group ``key`` on the lowest free VLAN, then move it until no other port group
    shares that VLAN (two picked it at once); removed again if that fails."""
    for _attempt in range(RECORD_TRIES):
        vlan = _free_vlan(driver)
        group = vim.host.PortGroup.Specification(
            name=key, vlanId=vlan, vswitchName=SWITCH, policy=vim.host.NetworkPolicy()
        )
        driver._call(f"add port group {key} (VLAN {vlan}) on {driver.host_name}", ns.AddPortGroup, portgrp=group)
        try:
            # One with a VM on it was handed out meanwhile (by a create of this key that came
            # between): it stays, and the other port group, added after it, sees it and moves.
            if not _sharing(driver, key) or _users(driver, key):
                return
        except Exception:
            with contextlib.suppress(DriverError):  # (the host may not answer this either)
                driver._call(f"remove port group {key} on {driver.host_name}", ns.RemovePortGroup, pgName=key)
            raise
        driver._call(f"remove port group {key} on {driver.host_name}", ns.RemovePortGroup, pgName=key)
    raise DriverError(
        f"network {key} on {driver.host_name}: no VLAN of {SWITCH} stayed free for it; try again", permanent=False
    )


def delete(driver, key):
    base.check_key(key)
    groups, _ = layout(driver)
    if key not in groups:
        distributed = overlay.port_groups(driver).get(key)
        if distributed is not None and overlay.ours(distributed[1]):
            return overlay.delete(driver, key, distributed[0])
        if key in recorded(driver):
            record(driver, key, None)
        return False
    if groups[key] != SWITCH:
        raise Conflict(f"port group {key} on {driver.host_name} was not made by vclmgr: left alone")
    users = sorted(_users(driver, key))
    if users:
        raise Conflict(f"network {key} on {driver.host_name} is still used by {', '.join(users)}")
    ns = driver._host().configManager.networkSystem
    driver._call(f"remove port group {key} on {driver.host_name}", ns.RemovePortGroup, pgName=key)
    record(driver, key, None)
    return True


def _users(driver, key):
    """This host's VMs with a NIC on port group ``key`` (read from their devices: vcsim keeps
    no ``Network.vm``)."""
    users = []
    for vm in driver._props(driver._host(), ["vm"]).get("vm") or []:
        try:
            props = driver._props(vm, ["name", "config.hardware.device"])
        except NotFound:
            continue  # deleted meanwhile (vcsim also keeps deleted VMs in a host's list)
        devices = props.get("config.hardware.device") or []
        nics = [d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)]
        if any(getattr(nic.backing, "deviceName", None) == key for nic in nics):
            users.append(props["name"])
    return users


def check_move(driver, target, vm, key):
    """A Conflict when VM ``key`` is on a private network the target host does not have: a
    port group of this host's switch, or a distributed one of a switch the target is not a
    member of; its NIC would reach nobody there."""
    ours, _ = layout(driver)
    theirs, _ = layout(target)
    devices = driver._props(vm, ["config.hardware.device"]).get("config.hardware.device") or []
    distributed = None
    for nic in devices:
        if not isinstance(nic, vim.vm.device.VirtualEthernetCard):
            continue
        name = getattr(nic.backing, "deviceName", None)
        if ours.get(name) == SWITCH and theirs.get(name) != SWITCH:
            raise Conflict(
                f"{key} is on private network {name}, which {target.host_name} does not have: "
                "the members of a private network share a host, or hosts of one overlay"
            )
        port = getattr(nic.backing, "port", None)
        if port is not None:
            distributed = distributed or {p["key"]: (n, p) for n, (_g, p) in overlay.port_groups(driver).items()}
            name, props = distributed.get(port.portgroupKey, (None, None))
            if (
                props
                and overlay.ours(props)
                and not overlay.is_member(driver, props["config.distributedVirtualSwitch"], target._host())
            ):
                raise Conflict(
                    f"{key} is on private network {name}, whose distributed switch {target.host_name} "
                    "is not a member of"
                )


def listed(driver):
    groups, _ = layout(driver)
    networks = recorded(driver)
    local = [
        NetworkInfo(name, networks.get(name, {}).get("cidr", ""))
        for name, switch in sorted(groups.items())
        if switch == SWITCH
    ]
    return sorted(local + overlay.listed(driver), key=lambda info: info.key)


def find(driver, key):
    """The datacenter's network named ``key``, or None."""
    return next((net for net in driver._datacenter().network if net.name == key), None)


def check_on_host(driver, spec):
    """NotFound unless every private network of ``spec`` is a port group of this host's switch,
    or vclmgr's distributed one on a switch this host is a member of."""
    if not spec.private_networks:
        return
    groups, _ = layout(driver)
    for key, _mac in spec.private_networks:
        if groups.get(key) != SWITCH and not overlay.reaches(driver, key):
            raise NotFound(f"{spec.key}: no private network {key} on {driver.host_name}; create it first")
