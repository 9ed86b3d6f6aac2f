"""Private networks on a VMware host: port groups on a standard vSwitch with no uplink.

Network rule: the vSwitch ``vclmgr-private`` is made without any physical NIC (no bridge in
its specification), so a frame sent on one of its port groups reaches only the VMs of that
port group on this host and nothing outside it; the port group carries no VLAN tag (id 0), as
nothing leaves the switch to be told apart. A port group is named by the network's key.

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

import hashlib
import json
import threading
import time
from collections import defaultdict

from pyVmomi import vim

from drivers import base
from drivers.base import Conflict, Invalid, NetworkInfo, NotFound

SWITCH = "vclmgr-private"
SWITCH_PORTS = 128
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


def layout(driver):
    """``{port group name: vSwitch name}`` of the driver's host."""
    info = driver._props(driver._host().configManager.networkSystem, ["networkInfo"]).get("networkInfo")
    groups = {}
    for switch in getattr(info, "vswitch", None) or []:
        for name in switch.portgroup or []:  # vcsim lists names, vSphere keys (key-vim.host.PortGroup-<name>)
            groups[str(name).removeprefix("key-vim.host.PortGroup-")] = switch.name
    return groups, {switch.name for switch in getattr(info, "vswitch", None) or []}


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
            driver._call(f"record network {key}", manager.SetField, entity=driver._host(), key=field.key, value=value)
            if recorded(driver).get(key) == entry:
                return
            time.sleep(0.05 * (attempt + 1))  # another writer's value came between: read it and redo ours
    raise Conflict(f"network {key} on {driver.host_name}: its record kept being overwritten; try again")


def create(driver, spec):
    spec.validate()
    groups, switches = layout(driver)
    ns = driver._host().configManager.networkSystem
    if spec.key not in groups:
        if SWITCH not in switches:
            try:  # no bridge: the switch has no uplink
                driver._call(
                    f"add vSwitch {SWITCH}",
                    ns.AddVirtualSwitch,
                    vswitchName=SWITCH,
                    spec=vim.host.VirtualSwitch.Specification(numPorts=SWITCH_PORTS),
                )
            except Conflict:
                pass  # made by a concurrent call meanwhile
        _record(driver, spec.key, {"cidr": str(spec.network), "fingerprint": spec.fingerprint()})
        group = vim.host.PortGroup.Specification(
            name=spec.key, vlanId=0, vswitchName=SWITCH, policy=vim.host.NetworkPolicy()
        )
        try:
            driver._call(f"add port group {spec.key}", ns.AddPortGroup, portgrp=group)
        except Conflict:
            pass  # a concurrent create, or a port group of another switch: judged below
        groups, _ = layout(driver)
    mine = recorded(driver).get(spec.key, {})
    if groups.get(spec.key) != SWITCH or mine.get("fingerprint") != spec.fingerprint():
        raise base.network_conflict(spec.key, driver.host_name)
    return NetworkInfo(spec.key, mine["cidr"])


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
    driver._call(f"remove port group {key}", ns.RemovePortGroup, pgName=key)
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
