"""A suspended VM moved to another host with its saved memory (``LibvirtDriver.migrate`` of a
managed-saved domain).

libvirt has no call that moves a managed-save image, and its offline migration moves the
definition alone. So the move is made of calls it has, in steps each recognisable afterwards:
a call retried after a crash goes on from where the last one stopped.

1. Checks, before anything changes: the target's pool, the VM's base image staged there (and
   the kernel and initrd of a VM that boots one directly), the overlay's qcow2 header able to
   name the target's base (``qcow2.rebased``).
2. Source: the saved memory into the volume ``<key>.save`` of its pool. The managed save is
   restored paused (the guest does not run, but its memory is held on the source for those
   seconds) and saved into that volume (``virDomainSaveFlags``); the domain is shut off then,
   without a managed save.
3. The overlay (its header naming the target's base), the seed and ``<key>.save`` streamed into
   the target's pool (``virStorageVolDownload`` → ``virStorageVolUpload``), each made afresh.
4. Target: ``<key>.save`` restored paused (``virDomainRestoreFlags``, its XML's paths those of
   the target's pool), the definition and its snapshots defined there, and a managed save
   again, recorded as running: the VM is suspended there as if it had been suspended there,
   and ``start`` resumes it.
5. ``<key>.save`` deleted on the target; the source's domain undefined and its overlay, seed
   and ``<key>.save`` deleted (``LibvirtDriver.destroy``).

A failure in steps 2–4 is undone before it is raised: the source's definition is back, the
target's domain and copies are removed, and the memory is managed-saved again on the source
from ``<key>.save``, which is deleted: the VM is suspended on the source as it was. If the
undo fails too, the error says so. A failure in step 5 leaves the VM on the target (suspended,
whole); a retry finishes the clean-up.

Two hosts may be two pools of one libvirtd (the tests' setup): a domain is the host's whose
pool holds its disk (``LibvirtDriver._elsewhere``); the target's restore and definition take
the one domain over, the undo gives it back, and the source's clean-up leaves it alone.
"""

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import libvirt

from drivers.base import Conflict, DriverError, Invalid, NotFound, VMState
from drivers.libvirt import domxml, qcow2

CHUNK = 1 << 20
HEADER_BYTES = 1 << 21  # the largest qcow2 cluster: the header and its backing file name lie within it
UNDEFINE = libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA


def save_name(key):
    return f"{key}.save"


def wanted(source, target, key):
    """True when migrating ``key`` is this move: it is suspended on the source, or this move is
    under way (its memory saved into ``<key>.save`` there, or the domain on the target)."""
    dom = source._own_domain(key)
    if dom is not None:
        if source._state(dom) == VMState.SUSPENDED:
            return True
        return not dom.isActive() and source._volume(source._pool(), save_name(key)) is not None
    there = target._own_domain(key)
    return there is not None and target._state(there) == VMState.SUSPENDED


def move(source, target, key):
    """Move the suspended VM ``key`` from ``source`` to ``target`` (``LibvirtDriver``s); see above."""
    there = target._own_domain(key)
    if there is None or not _settled(there):
        plan = _plan(source, target, key)
        try:
            if there is None:
                _save(source, key)
                _copy(source, target, plan)
            _settle(target, plan)
        except Exception as exc:
            _undo(source, target, plan, exc)
            raise
    save = target._volume(target._pool(), save_name(key))
    if save is not None:
        target._call(f"delete the saved memory of {key} on {target.host_name}", save.delete, 0)
    source.destroy(key)  # its definition and volumes; not the target's domain (one libvirtd: _elsewhere)


def _settled(dom):
    return not dom.isActive() and dom.hasManagedSaveImage(0)


@dataclass
class Plan:
    key: str
    paths: dict  # source path → target path: overlay, seed, base image, kernel and initrd
    volumes: list  # (name, the first bytes to upload instead of the source's: the rebased header, or b"")
    source_xml: str  # the definition, its paths the source's (the undo defines it again)
    source_snapshots: list = field(default_factory=list)

    def target_xml(self):
        return domxml.repathed(self.source_xml, self.paths)

    def target_snapshots(self):
        return [domxml.repathed(xml, self.paths) for xml in self.source_snapshots]


def _plan(source, target, key):
    """What the move copies and how its paths change; raises before anything has changed."""
    if source.options.get("shared_storage") or target.options.get("shared_storage"):
        # Copying would delete the one disk both hosts see; restoring from it in place: not yet.
        raise Invalid(f"moving a suspended VM between hosts on shared storage is not supported yet ({key})")
    spool, tpool = source._pool(), target._pool()
    dom = source._find_domain(key)  # (one libvirtd: the one domain, wherever its disk is by now)
    if dom is None:
        raise NotFound(f"no VM {key} on {source.host_name}")
    disk = source._volume(spool, f"{key}.qcow2")
    if disk is None:
        raise NotFound(f"the disk of {key} ({key}.qcow2) is not in pool {spool.name()} on {source.host_name}")
    tdir = _pool_dir(target, tpool)
    paths, volumes = {disk.path(): f"{tdir}/{key}.qcow2"}, []
    header, base = _rebased_header(source, target, tpool, disk)
    if base is not None:
        paths[base[0]] = base[1]
    volumes.append((disk.name(), header))
    paths.update(source.boot_paths_on(target, source._call(f"definition of {key}", dom.XMLDesc, 0)))
    seed = source._volume(spool, f"{key}-seed.iso")
    if seed is not None:
        paths[seed.path()] = f"{tdir}/{seed.name()}"
        volumes.append((seed.name(), b""))
    volumes.append((save_name(key), b""))
    back = {new: old for old, new in paths.items()}  # a retried call may find the target's paths defined
    flags = libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE
    xml = source._call(f"definition of {key}", dom.XMLDesc, flags)
    snapshots = [
        domxml.repathed(snap.getXMLDesc(libvirt.VIR_DOMAIN_SNAPSHOT_XML_SECURE), back)
        for snap in dom.listAllSnapshots(libvirt.VIR_DOMAIN_SNAPSHOT_LIST_TOPOLOGICAL)
    ]
    return Plan(key, paths, volumes, domxml.repathed(xml, back), snapshots)


def _pool_dir(driver, pool):
    path = ET.fromstring(pool.XMLDesc(0)).findtext("target/path")
    if not path:
        raise Invalid(f"storage pool {pool.name()} on {driver.host_name} has no directory to hold saved memory")
    return path.rstrip("/")


def _rebased_header(source, target, tpool, disk):
    """The overlay's first cluster with its backing file name the target's base (or b"" when it
    names it already, or has none), and ``(source base path, target base path)`` or None."""
    if ET.fromstring(disk.XMLDesc(0)).find("target/format").get("type") != "qcow2":
        return b"", None
    prefix = _download(source, disk, 0, HEADER_BYTES)
    try:
        prefix = prefix[: qcow2.cluster_size(prefix)]
        old = qcow2.backing_file(prefix)
    except qcow2.NotQcow2 as exc:
        raise Invalid(f"the disk of {disk.name()} cannot be moved: {exc}") from None
    if old is None:
        return b"", None
    new = _target_base(target, tpool, old, disk.name())
    if new == old:
        return b"", None
    try:
        return qcow2.rebased(prefix, new), (old, new)
    except qcow2.NotQcow2 as exc:
        raise Invalid(f"the disk of {disk.name()} cannot be moved to {target.host_name}: {exc}") from None


def _target_base(target, tpool, old, what):
    """The path of the base image ``old`` on the target: the volume of the same name in its pool
    (staged there: ``stage_image`` names it by image and checksum), or the same path (shared storage)."""
    vol = target._volume(tpool, os.path.basename(old))
    if vol is not None:
        return vol.path()
    try:
        target.conn.storageVolLookupByPath(old)
    except libvirt.libvirtError:
        name = os.path.basename(old)
        raise NotFound(f"the base image of {what} ({name}) is not staged on {target.host_name}") from None
    return old


def _download(driver, vol, offset, length):
    stream = driver.conn.newStream(0)
    data = bytearray()
    try:
        driver._call(f"download {vol.name()}", vol.download, stream, offset, length, 0)
        while chunk := driver._call(f"download {vol.name()}", stream.recv, CHUNK):  # b"" at its end
            data += chunk
        driver._call(f"download {vol.name()}", stream.finish)
    except BaseException:
        _abort(stream)
        raise
    return bytes(data)


def _save(source, key):
    """Step 2 (idempotent): the source's managed save into ``<key>.save`` of its pool."""
    dom = source._own_domain(key)
    if dom is None:
        raise NotFound(f"no VM {key} on {source.host_name}")
    pool = source._pool()
    old = source._volume(pool, save_name(key))
    if not dom.isActive():
        if not dom.hasManagedSaveImage(0):
            if old is not None:
                return  # saved already
            raise Conflict(f"{key} on {source.host_name} is stopped: it has no memory to move")
        # The guest does not run: restored paused, it is saved at once.
        source._call(f"restore {key} paused to move it", dom.createWithFlags, libvirt.VIR_DOMAIN_START_PAUSED)
    elif not source._paused(dom):
        raise Conflict(f"{key} runs on {source.host_name}: it is no longer suspended")
    if old is not None:  # left by an attempt whose undo died: the managed save was the memory
        source._call(f"delete stale {old.name()}", old.delete, 0)
    vol = source._call(
        f"create {save_name(key)}", pool.createXML, domxml.volume_xml(save_name(key), 0, "raw", allocation_bytes=0), 0
    )
    source._call(f"save the memory of {key}", dom.saveFlags, vol.path(), None, libvirt.VIR_DOMAIN_SAVE_RUNNING)


def _copy(source, target, plan):
    """Step 3: each volume streamed into the target's pool, made afresh (a copy cut short by a
    crash is never taken for a whole one)."""
    spool, tpool = source._pool(), target._pool()
    for name, header in plan.volumes:
        src = source._volume(spool, name)
        if src is None:
            raise NotFound(f"{name} is not in pool {spool.name()} on {source.host_name}")
        _type, _capacity, size = source._call(f"size of {name}", src.infoFlags, libvirt.VIR_STORAGE_VOL_GET_PHYSICAL)
        old = target._volume(tpool, name)
        if old is not None:
            target._call(f"delete an unfinished copy of {name}", old.delete, 0)
        xml = domxml.volume_xml(name, size, "raw", allocation_bytes=0)  # the bytes say what it is
        dst = target._call(f"create {name} on {target.host_name}", tpool.createXML, xml, 0)
        try:
            _stream(source, src, target, dst, size, header)
        except BaseException:
            dst.delete(0)
            raise
    try:
        tpool.refresh(0)  # the copies' formats probed (a qcow2 overlay, not raw bytes)
    except libvirt.libvirtError:
        pass  # a pool busy with another job's volume: the next facts refresh probes them


def _stream(source, src, target, dst, size, header):
    up = target.conn.newStream(0)
    down = None
    try:
        target._call(f"upload to {dst.name()}", dst.upload, up, 0, size, 0)
        _send(target, up, header)
        if size > len(header):
            down = source.conn.newStream(0)
            source._call(f"download {src.name()}", src.download, down, len(header), size - len(header), 0)
            while chunk := source._call(f"download {src.name()}", down.recv, CHUNK):
                _send(target, up, chunk)
            source._call(f"download {src.name()}", down.finish)
        target._call(f"upload to {dst.name()}", up.finish)
    except BaseException:
        for stream in (down, up):
            _abort(stream)
        raise


def _send(driver, stream, data):
    view = memoryview(data)
    while view:
        view = view[driver._call("upload", stream.send, bytes(view)) :]


def _abort(stream):
    if stream is not None:
        try:
            stream.abort()
        except libvirt.libvirtError:
            pass


def _settle(target, plan):
    """Step 4 (idempotent): restored paused on the target, defined there, managed-saved there."""
    key, tpool = plan.key, target._pool()
    there = target._own_domain(key)
    if there is None or not (there.isActive() or there.hasManagedSaveImage(0)):
        save = target._volume(tpool, save_name(key))
        if save is None:
            raise NotFound(f"the saved memory of {key} is not on {target.host_name}")
        xml = target._call(
            f"saved definition of {key}",
            target.conn.saveImageGetXMLDesc,
            save.path(),
            libvirt.VIR_DOMAIN_SAVE_IMAGE_XML_SECURE,
        )
        target._call(
            f"restore {key} on {target.host_name}",
            target.conn.restoreFlags,
            save.path(),
            domxml.repathed(xml, plan.paths),
            libvirt.VIR_DOMAIN_SAVE_PAUSED,
        )
        there = target._domain(key)
    if there.isActive():
        _define(target, key, plan.target_xml(), plan.target_snapshots())
        target._call(f"suspend {key} on {target.host_name}", there.managedSave, libvirt.VIR_DOMAIN_SAVE_RUNNING)


def _define(driver, key, xml, snapshots):
    dom = driver._call(f"define {key} on {driver.host_name}", driver.conn.defineXML, xml)
    for snap in snapshots:  # redefined: also where they exist (their paths are the host's)
        driver._call(
            f"define a snapshot of {key}", dom.snapshotCreateXML, snap, libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE
        )


def _undo(source, target, plan, exc):
    """Back to the VM suspended on the source; a failure here is raised with ``exc`` in it."""
    key = plan.key
    try:
        _define(source, key, plan.source_xml, plan.source_snapshots)  # one libvirtd: the target took it over
        there = target._own_domain(key)
        if there is not None and there.isActive():
            target._call(f"power off {key} on {target.host_name}", there.destroy)
        there = target._own_domain(key)
        if there is not None:  # its definition on another libvirtd
            target._call(f"undefine {key} on {target.host_name}", there.undefineFlags, UNDEFINE)
        tpool = target._pool()
        for name, _header in plan.volumes:
            vol = target._volume(tpool, name)
            if vol is not None:
                target._call(f"delete the copy of {name}", vol.delete, 0)
        _suspend_again(source, key)
    except Exception as failed:
        raise DriverError(
            f"moving {key} to {target.host_name} failed ({exc}), and undoing it failed too: {failed}; "
            f"its saved memory may be in {save_name(key)} on {source.host_name}",
            permanent=True,
        ) from exc


def _suspend_again(source, key):
    """The source's memory back into a managed save, from wherever step 2 left it."""
    dom = source._own_domain(key)
    if dom is None:
        raise NotFound(f"no VM {key} on {source.host_name}")
    save = source._volume(source._pool(), save_name(key))
    if not dom.isActive() and not dom.hasManagedSaveImage(0):
        if save is None:
            raise Conflict(f"{key} on {source.host_name} has neither a managed save nor {save_name(key)}")
        source._call(
            f"restore {key} paused", source.conn.restoreFlags, save.path(), None, libvirt.VIR_DOMAIN_SAVE_PAUSED
        )
        dom = source._domain(key)
    if dom.isActive():
        source._call(f"suspend {key} again", dom.managedSave, libvirt.VIR_DOMAIN_SAVE_RUNNING)
    if save is not None:
        source._call(f"delete {save.name()}", save.delete, 0)
