"""libvirt's own migration of a VM (``LibvirtDriver.migrate`` of a running VM, or of a stopped
one on shared storage): ``virDomainMigrate``, persistent on the target, undefined on the source.

- Running: live (``VIR_MIGRATE_LIVE``). Over the operator's ``shared_storage`` the memory only,
  and with an uncached disk also from a file system libvirt does not know as shared (it knows
  NFS, GFS2, OCFS2, CephFS, GPFS, …, and refuses any other as unsafe; the option vouches for it,
  and no page cache on the source holds writes the target cannot see: ``VIR_MIGRATE_UNSAFE``).
  Without shared storage the disk's own data too (``VIR_MIGRATE_NON_SHARED_INC``; the target's
  side made first by ``copying.prepare``, removed again if the migration fails).
- Stopped (shared storage only): offline, the definition alone.
- Snapshots: libvirt refuses to migrate a running domain that has any ("cannot migrate domain
  with 1 snapshots") and moves none with a stopped one. Over shared storage they live in the
  disk both hosts see, so their definitions are handed over: taken off the source (metadata
  only), redefined on the target after the migration, or on the source again if it failed. (A
  worker that dies in between leaves the disk's snapshots without libvirt's definitions; the
  VM runs on.) A copied disk would lose them (libvirt copies the disk's current state only),
  so that is refused before anything changes: stop the VM and migrate it, which copies its
  whole disk.

``migrate`` returns what libvirt measured of a live migration (``MIGRATION_FIGURES``), or None.
"""

import logging

import libvirt

from drivers.base import Conflict
from drivers.libvirt import copying, domxml

log = logging.getLogger(__name__)

UNCACHED = ("none", "directsync")  # disk cache modes safe for live migration over shared storage
#: libvirt's figures of a completed migration (``virDomainGetJobStats``) → the names we record.
MIGRATION_FIGURES = {
    "downtime": "downtime_ms",  # the guest paused: the last memory pages and the switch-over
    "time_elapsed": "total_ms",
    "memory_processed": "memory_bytes",
}  # (not the disk's: the target's statistics count no bytes of a disk copied to it, always 0)


def migrate(source, target, dom, boot):
    """``dom`` (the VM on ``source``) to ``target``; ``boot``: the paths of its kernel and initrd
    there (``LibvirtDriver.boot_paths_on``)."""
    key, running = dom.name(), dom.isActive()
    shared = bool(source.options.get("shared_storage"))
    copies = running and not shared
    snapshots = _snapshots(source, dom)
    if snapshots and copies:
        raise Conflict(
            f"{key} has {len(snapshots)} snapshot(s), which a live migration that copies its disk would lose: "
            "stop it and migrate it (its whole disk is copied then), or migrate between hosts on shared storage"
        )
    flags = libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
    flags |= libvirt.VIR_MIGRATE_LIVE if running else libvirt.VIR_MIGRATE_OFFLINE
    if not shared:
        flags |= libvirt.VIR_MIGRATE_NON_SHARED_INC
    elif running and source._disk_cache() in UNCACHED:
        flags |= libvirt.VIR_MIGRATE_UNSAFE
    paths = {**boot, **(copying.prepare(source, target, key) if copies else {})}
    _lift(source, dom, snapshots)
    try:
        moved = _migrate(source, target, dom, flags, paths)
    except Exception:
        if copies:
            _discard_copies(source, target, key)
        _give_back(source, target, key, snapshots)
        raise
    _put_back(target, moved, snapshots, paths)
    if not shared:
        _delete_left(source, key)
    return _measured(moved) if running else None


def _migrate(source, target, dom, flags, paths):
    key = dom.name()
    if paths:  # the definition on the target names the target's files
        dxml = domxml.repathed(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE), paths)
        return source._call(
            f"migrate {key} to {target.host_name}", dom.migrate2, target.conn, dxml, flags, None, None, 0
        )
    return source._call(f"migrate {key} to {target.host_name}", dom.migrate, target.conn, flags, None, None, 0)


def _snapshots(driver, dom):
    """``[(xml, current)]`` of the domain's snapshots, parents first."""
    found = driver._call(
        f"snapshots of {dom.name()}", dom.listAllSnapshots, libvirt.VIR_DOMAIN_SNAPSHOT_LIST_TOPOLOGICAL
    )
    return [(snap.getXMLDesc(libvirt.VIR_DOMAIN_SNAPSHOT_XML_SECURE), snap.isCurrent(0) == 1) for snap in found]


def _lift(driver, dom, snapshots):
    """The snapshots' definitions off the domain (the snapshots stay in its disk)."""
    if not snapshots:
        return
    for snap in reversed(dom.listAllSnapshots(libvirt.VIR_DOMAIN_SNAPSHOT_LIST_TOPOLOGICAL)):  # children first
        driver._call(
            f"hand over snapshot {snap.getName()}", snap.delete, libvirt.VIR_DOMAIN_SNAPSHOT_DELETE_METADATA_ONLY
        )


def _put_back(driver, dom, snapshots, paths):
    """The snapshots' definitions on ``dom`` (where the VM is now), their paths ``paths``-mapped."""
    if not snapshots:
        return
    if dom is None:
        log.error("%d snapshot definition(s) lost: the VM is on neither host", len(snapshots))
        return
    existing = set(driver._call(f"snapshots of {dom.name()}", dom.snapshotListNames, 0))
    for xml, current in snapshots:
        flags = libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE
        flags |= libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_CURRENT if current else 0
        if domxml.ET.fromstring(xml).findtext("name") not in existing:
            driver._call(f"snapshot of {dom.name()}", dom.snapshotCreateXML, domxml.repathed(xml, paths), flags)


def _give_back(source, target, key, snapshots):
    """After a failed migration: the snapshots' definitions where the VM is (the source, unless
    it got to the target after all). A failure here is logged: the migration's error is raised."""
    try:
        dom = source._own_domain(key)
        if dom is not None:
            _put_back(source, dom, snapshots, {})
        else:
            _put_back(target, target._find_domain(key), snapshots, {})
    except Exception:  # noqa: BLE001
        log.error("the snapshot definitions of %s were not given back after the failed migration", key, exc_info=True)


def _discard_copies(source, target, key):
    """After a failed migration that copied the disk: the target's copies go, unless the VM
    got there after all (a failure reported after the switch-over). A failure to tell or to
    delete leaves them (garbage on the target, not the VM's disk)."""
    try:
        if source._own_domain(key) is not None:
            copying.discard(target, key)
    except Exception:  # noqa: BLE001 (the migration's own error is the one to raise)
        log.warning("the copies of %s on %s stay after the failed migration", key, target.host_name, exc_info=True)


def _delete_left(source, key):
    """After a migration that copied the disk, the source's overlay and seed are garbage (the
    seed holds the user's password hash)."""
    if source._find_domain(key) is not None:
        return
    for name in copying.names(key):
        vol = source._volume(source._pool(), name)
        if vol is not None:
            source._call(f"delete {name}", vol.delete, 0)


def _measured(dom):
    """What libvirt measured of the migration that brought ``dom`` to the target (the target
    keeps the completed job's statistics): ``MIGRATION_FIGURES``; {} when it kept none."""
    try:
        stats = dom.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED) if dom is not None else {}
    except libvirt.libvirtError:
        return {}
    return {name: int(stats[key]) for key, name in MIGRATION_FIGURES.items() if key in stats}
