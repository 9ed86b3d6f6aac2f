"""Migrations that copy the disk, between hosts without shared storage (``LibvirtDriver.migrate``).

A running VM: libvirt's live migration with ``VIR_MIGRATE_NON_SHARED_INC``, for which the target
side is made here first (``prepare``). A stopped VM: libvirt's offline migration moves the
definition only ("offline migration cannot handle non-shared storage"), so ``move_stopped``
streams the overlay and the seed into the target's pool itself, the overlay's header naming the
target's base (``moving.py``'s copy), defines the VM and its snapshots there, and then removes
it from the source. A retry after a crash finds the target's definition (made only once the
copies are whole) and only removes the source's.

Live:

libvirt copies the overlay's own clusters into a volume that must exist on the target already
(it creates none for an incremental copy: "pre-creation of storage targets for incremental
storage migration is not supported"), backed by the target's copy of the base image; and it
copies no read-only disk. So before the migration:

1. the overlay ``<key>.qcow2`` is made in the target's pool, of the source's size, backed by the
   base image staged there (``vm.migrate``'s stage-target step staged it);
2. the seed ``<key>-seed.iso`` is streamed into the target's pool whole (it is small);

and ``prepare`` returns ``{source path: target path}`` for the definition on the target (the
same paths when both pools are the same directory, as on hosts set up alike). ``discard``
removes both copies after a migration that failed and left the VM on the source; after one that
succeeded, the source's overlay and seed are garbage (``LibvirtDriver._delete_left_disk``).
"""

import xml.etree.ElementTree as ET

import libvirt

from drivers.base import NotFound
from drivers.libvirt import domxml, moving


def names(key):
    return f"{key}.qcow2", f"{key}-seed.iso"


def prepare(source, target, key):
    """Steps 1 and 2 (idempotent: a copy left by an earlier attempt is made afresh)."""
    spool, tpool = source._pool(), target._pool()
    disk_name, seed_name = names(key)
    disk = source._volume(spool, disk_name)
    if disk is None:
        raise NotFound(f"the disk of {key} ({disk_name}) is not in pool {spool.name()} on {source.host_name}")
    discard(target, key)
    paths = {}
    _type, capacity, _allocation = source._call(f"size of {disk_name}", disk.info)
    backing, backing_format = _backing(source, disk)
    if backing is not None:
        new = moving._target_base(target, tpool, backing, disk_name)
        if new != backing:
            paths[backing] = new
        backing = new
    xml = domxml.volume_xml(disk_name, capacity, "qcow2", backing, backing_format)
    made = target._call(f"create {disk_name} on {target.host_name}", tpool.createXML, xml, 0)
    paths[disk.path()] = made.path()
    seed = source._volume(spool, seed_name)
    if seed is not None:
        _type, _capacity, size = source._call(
            f"size of {seed_name}", seed.infoFlags, libvirt.VIR_STORAGE_VOL_GET_PHYSICAL
        )
        xml = domxml.volume_xml(seed_name, size, "raw", allocation_bytes=0)
        copy = target._call(f"create {seed_name} on {target.host_name}", tpool.createXML, xml, 0)
        moving._stream(source, seed, target, copy, size, b"")
        paths[seed.path()] = copy.path()
    return {old: new for old, new in paths.items() if old != new}


def _backing(driver, vol):
    """``(path, format)`` of the volume's backing image, or ``(None, None)``."""
    root = ET.fromstring(driver._call(f"definition of {vol.name()}", vol.XMLDesc, 0))
    backing = root.find("backingStore")
    if backing is None or not backing.findtext("path"):
        return None, None
    fmt = backing.find("format")
    return backing.findtext("path"), fmt.get("type") if fmt is not None else None


def discard(target, key):
    """The target's copies of the VM's overlay and seed, unless the VM is defined there."""
    if target._find_domain(key) is not None:
        return
    tpool = target._pool()
    for name in names(key):
        vol = target._volume(tpool, name)
        if vol is not None:
            target._call(f"delete {name} on {target.host_name}", vol.delete, 0)


def move_stopped(source, target, key):
    """The stopped VM ``key`` to ``target`` with its overlay and seed; see the module docstring."""
    if target._own_domain(key) is None:
        plan = moving._plan(source, target, key)
        plan.volumes = [(name, header) for name, header in plan.volumes if name != moving.save_name(key)]
        try:
            moving._copy(source, target, plan)
            moving._define(target, key, plan.target_xml(), plan.target_snapshots())
        except Exception:
            there = target._own_domain(key)
            if there is not None:  # defined, a snapshot refused: not moved
                target._call(f"undefine {key} on {target.host_name}", there.undefineFlags, moving.UNDEFINE)
            discard(target, key)
            raise
    source.destroy(key)
