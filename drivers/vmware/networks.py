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

vSphere keeps no address range on a port group, so the network's range and fingerprint (for
``create_network``'s idempotency and conflicts) are recorded in the host's custom attribute
``vclmgr.networks`` (JSON, key → {cidr, fingerprint}): private networks need vCenter, which
has custom attributes (a standalone ESXi host has none). DHCP and DNS are not provided here:
the members' guests configure their addresses themselves.

That attribute is one value per host, so recording a network reads, changes and writes it
back. vSphere has no compare-and-set for it: calls of one process are serialised per host (a
lock), and every write is read back and redone until it holds (another writer's lost entry is
written again by that writer). Two workers writing the same host at the same instant can still
lose one entry after its writer checked it; the jobs that make and delete a host's networks
must therefore hold that host's job lock exclusively (``hypervisor:<id>``), as other
host-wide changes do. A lost entry shows as a conflict on the next ``create_network`` of that
key, never as a network leaking to another.

A NIC's static MAC on ESXi must lie in VMware's manual range, 00:50:56:00:00:00 to
00:50:56:3f:ff:ff: ``mac`` gives a private NIC's there (stable per VM and network, as
``base.private_mac``), and a ``VMSpec`` with a private MAC outside it is refused.
"""

import contextlib
import hashlib
import json
import threading
import time
from collections import defaultdict

from pyVmomi import vim

from drivers import base
from drivers.base import Conflict, DriverError, Invalid, NetworkInfo, NotFound

SWITCH = "vclmgr-private"
SWITCH_PORTS = 128
VLANS = range(1, 4095)  # 0 is untagged, 4095 a trunk that sees every VLAN
FIELD = "vclmgr.networks"
#: ESXi takes a static MAC only under VMware's prefix with the next bits 00: 22 bits free.
MANUAL_PREFIX = "00:50:56"
MANUAL_TOP = 0x3F
RECORD_TRIES = 5
_host_locks = defaultdict(threading.Lock)


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


def _field(driver, create):
    manager = driver.si.content.customFieldsManager
    if manager is None:
        raise Invalid(f"{driver.endpoint[1]} has no custom attributes: private networks on VMware need vCenter")
    for field in manager.field or []:
        if field.name == FIELD and field.managedObjectType in (vim.HostSystem, None):
            return field
    if not create:
        return None
    try:
        add = manager.AddCustomFieldDef
        return driver._call(f"add custom attribute {FIELD}", add, name=FIELD, moType=vim.HostSystem)
    except Conflict:  # made by a concurrent call meanwhile
        return next(f for f in manager.field or [] if f.name == FIELD)


def recorded(driver):
    """key → {cidr, fingerprint} of the host's private networks, as recorded."""
    field = _field(driver, create=False)
    if field is None:
        return {}
    found = driver._props(driver._host(), ["customValue"]).get("customValue") or []
    values = [v.value for v in found if v.key == field.key]
    return json.loads(values[-1]) if values and values[-1] else {}  # the last: vcsim appends rather than replaces


def _record(driver, key, entry):
    """Record ``entry`` for ``key`` (None: forget it): written, read back and written again
    until it holds (see the module docstring for what that does not cover)."""
    field = _field(driver, create=True)
    manager = driver.si.content.customFieldsManager
    with _host_locks[(driver.endpoint, driver.host_name)]:
        for attempt in range(RECORD_TRIES):
            networks = recorded(driver)
            if networks.get(key) == entry:
                return
            if entry is None:
                networks.pop(key, None)
            else:
                networks[key] = entry
            value = json.dumps(networks, sort_keys=True)
            driver._call(
                f"record network {key} on {driver.host_name}",
                manager.SetField,
                entity=driver._host(),
                key=field.key,
                value=value,
            )
            if recorded(driver).get(key) == entry:
                return
            time.sleep(0.05 * (attempt + 1))  # another writer's value came between: read it and redo ours
    raise Conflict(f"network {key} on {driver.host_name}: its record kept being overwritten; try again")


def create(driver, spec):
    spec.validate()
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
    _record(driver, spec.key, {"cidr": str(spec.network), "fingerprint": spec.fingerprint()})
    try:
        _add_group(driver, ns, spec.key)
    except Exception as exc:
        if isinstance(exc, Conflict) and layout(driver)[0].get(spec.key) == SWITCH:
            return  # a concurrent create of this key made it: the caller judges whose it is
        _record(driver, spec.key, None)
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
        if key in recorded(driver):
            _record(driver, key, None)
        return False
    if groups[key] != SWITCH:
        raise Conflict(f"port group {key} on {driver.host_name} was not made by vclmgr: left alone")
    users = sorted(_users(driver, key))
    if users:
        raise Conflict(f"network {key} on {driver.host_name} is still used by {', '.join(users)}")
    ns = driver._host().configManager.networkSystem
    driver._call(f"remove port group {key} on {driver.host_name}", ns.RemovePortGroup, pgName=key)
    _record(driver, key, None)
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
    """A Conflict when VM ``key`` is on a private network the target host does not have: there
    is no overlay between hosts, so its NIC would reach nobody there."""
    ours, _ = layout(driver)
    theirs, _ = layout(target)
    devices = driver._props(vm, ["config.hardware.device"]).get("config.hardware.device") or []
    for nic in devices:
        name = getattr(getattr(nic, "backing", None), "deviceName", None)
        private = isinstance(nic, vim.vm.device.VirtualEthernetCard) and ours.get(name) == SWITCH
        if private and theirs.get(name) != SWITCH:
            raise Conflict(
                f"{key} is on private network {name}, which {target.host_name} does not have: "
                "the members of a private network share a host"
            )


def listed(driver):
    groups, _ = layout(driver)
    networks = recorded(driver)
    return [
        NetworkInfo(name, networks.get(name, {}).get("cidr", ""))
        for name, switch in sorted(groups.items())
        if switch == SWITCH
    ]


def find(driver, key):
    """The datacenter's network named ``key``, or None."""
    return next((net for net in driver._datacenter().network if net.name == key), None)


def check_on_host(driver, spec):
    """NotFound unless every private network of ``spec`` is a port group of this host's switch."""
    if not spec.private_networks:
        return
    groups, _ = layout(driver)
    for key, _mac in spec.private_networks:
        if groups.get(key) != SWITCH:
            raise NotFound(f"{spec.key}: no private network {key} on {driver.host_name}; create it first")
