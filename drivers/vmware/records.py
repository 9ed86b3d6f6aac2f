"""The record of vclmgr's private networks on a VMware host: its custom attribute
``vclmgr.networks`` (JSON, key → {cidr, fingerprint}, and ``overlay`` for a network on one).

vSphere keeps no address range on a port group, so a network's range and fingerprint (for
``create_network``'s idempotency and conflicts) are recorded on the host: private networks need
vCenter, which has custom attributes (a standalone ESXi host has none).

That attribute is one value per host, so recording a network reads, changes and writes it
back. vSphere has no compare-and-set for it: calls of one process are serialised per host (a
lock), and every write is read back and redone until it holds (another writer's lost entry is
written again by that writer). Two workers writing the same host at the same instant can still
lose one entry after its writer checked it; the jobs that make and delete a host's networks
must therefore hold that host's job lock exclusively (``hypervisor:<id>``), as other
host-wide changes do. A lost entry shows as a conflict on the next ``create_network`` of that
key, never as a network leaking to another.
"""

import json
import threading
import time
from collections import defaultdict

from pyVmomi import vim

from drivers.base import Conflict, Invalid

FIELD = "vclmgr.networks"
RECORD_TRIES = 5
_host_locks = defaultdict(threading.Lock)


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


def recorded(driver, host=None):
    """key → {cidr, fingerprint, …} of the private networks recorded on ``host`` (the driver's
    by default)."""
    field = _field(driver, create=False)
    if field is None:
        return {}
    found = driver._props(host or driver._host(), ["customValue"]).get("customValue") or []
    values = [v.value for v in found if v.key == field.key]
    return json.loads(values[-1]) if values and values[-1] else {}  # the last: vcsim appends rather than replaces


def record(driver, key, entry):
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
