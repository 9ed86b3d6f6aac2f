"""The libvirt driver (KVM/QEMU, and libvirt's own ``test://`` driver in tests).

``LibvirtDriver(uri, credentials={"username", "password"}, options={...})``. Options (per
driver in ``VCLMGR_DRIVER_OPTIONS["libvirt"]``, per host in ``Hypervisor.driver_options``):
``pool`` (storage pool for images, disks and seeds; default ``default``, or the only pool),
``name`` (host name to report; default the node's host name, or the node file's name for
``test:///…xml``), ``domain_type`` (``kvm``, default; ``qemu`` for software emulation;
``test`` on the test driver), ``cpu_mode`` (``host-model``, the default under ``kvm``;
``host-passthrough``, ``maximum``, ``custom:<model>``, or ``none`` for QEMU's default, the
default under ``qemu``, which cannot use a host CPU mode), ``network`` (a libvirt network,
``bridge:<name>``, or ``user``: QEMU user-mode networking, the guest's login port forwarded
from a free port on the host's 127.0.0.1, for a one-machine setup; default the spec's),
``stop_timeout`` (seconds a graceful stop may take, default 120), ``vnc_listen`` (the address
the VMs' VNC displays listen on, default the host's ``127.0.0.1``; ``none``: no display).

The web console: ``console_address`` is the running domain's VNC display (libvirt picks its
port at start, so it follows the VM through a migration). A display on the host's loopback is
reachable only when vclmgr runs on that host (a ``qemu:///…`` or ``qemu+unix`` URI); for a
remote host, ``vnc_listen`` must be an address of a management network vclmgr reaches.
``serial_console`` is the domain's console stream through the libvirt connection itself
(``virDomainOpenConsole``; works over ``qemu+ssh`` too, needs no port).

The guest: a spec with ``guest`` gets a cloud-init NoCloud seed (``cloudinit.seed_iso``),
uploaded as the volume ``<key>-seed.iso`` beside its overlay and attached as a read-only
CD-ROM. The seed is part of the VM: a retried create adopts the domain and makes no second
seed, ``destroy`` deletes it with the overlay (it holds the password hash). ``reseed`` writes
it afresh for a VM's next user (the domain's metadata names the seed's instance id) or, with
no guest, deletes it and leaves the CD-ROM tray empty.

Images: ``stage_image`` uploads a verified qcow2/raw file into the pool as
``<image>-<checksum12>.<fmt>`` (uploaded under ``.part`` and copied into place, so a transfer
cut short never looks staged); a location that already is a volume path on the host (shared
storage) is used as it is. Each VM gets a qcow2 overlay ``<key>.qcow2`` backed by that base.
``capture`` copies a stopped VM's disk into a new base volume ``<image>.qcow2`` (qemu-img
flattens it).

Direct kernel boot: an image with a ``kernel`` (and ``initrd``) has them staged with its disk,
as ``<disk volume>.kernel-<checksum12>`` and ``.initrd-…`` (verified and uploaded like the
disk, before it: a staged disk means a staged image); ``unstage_image`` deletes them with the
disk. The domain boots them with the image's ``kernel_args`` (``<os><kernel>``), its disk only
attached. A capture of such a VM copies its kernel and initrd to ``<image>.kernel`` and
``<image>.initrd`` beside the captured disk and keeps its command line; a migration or move
names the target's staged copies in the definition it makes there.

Suspend is a managed save (memory to disk, host RAM freed). Migrate uses virDomainMigrate
(``live.py``: live when running, persistent on the target, copying non-shared disks, its
snapshots handed over; it returns what libvirt measured: downtime, total time, memory sent);
a stopped VM without shared storage moves its disk through the pools (``copying.py``); a suspended VM moves
with its saved memory through the pools instead (``moving.py``: libvirt cannot migrate a
managed save). libvirt's test driver does not implement migration (not even offline), so
between two ``test://`` connections it is emulated: copy the overlay volume, define on the
target, start there if it ran (and suspend it there again if it was suspended), then destroy
and undefine on the source. Snapshots travel with it (redefined).

Private networks (environments): ``create_network`` defines and starts an isolated libvirt
network (``netxml.py``: no forward, its own bridge, DHCP with the members' fixed addresses and
DNS names) marked as vclmgr's in its metadata, autostarted; a VM's ``private_networks`` are
virtio NICs on them, each of which must exist on the host first. ``delete_network`` stops and
undefines one no domain of the libvirtd uses; a network vclmgr did not make is never adopted
or deleted.

Two hosts may be two pools of one libvirtd (the real-QEMU tests): a domain then belongs to
the host whose pool holds its disk (``state`` and ``destroy`` leave another host's alone).

Connections are pooled per process and URI. A ``test:///file.xml`` connection has private
state, so that state lives exactly as long as this process.
"""

import logging
import os
import socket
import urllib.parse

import libvirt

from drivers import base, cloudinit
from drivers.base import Conflict, DriverError, HostFacts, Invalid, NetworkInfo, NotFound, VMInfo, VMState
from drivers.libvirt import agent, copying, domxml, gpus, live, moving, netxml, nodedev
from drivers.libvirt.connection import NOT_FOUND, connections, open_own, translate, translated
from drivers.libvirt.options import CPU_MODES, DISK_CACHES, vnc_listen_error

log = logging.getLogger(__name__)

GIB = 1 << 30


class LibvirtDriver(base.Driver):
    kind = "libvirt"
    moves_suspended = True  # its saved memory goes with it (moving.py)
    supports_networks = True

    def __init__(self, uri, credentials=None, options=None):
        super().__init__(uri, credentials, options)
        if not uri or "://" not in uri:
            raise Invalid(f"{uri!r} is not a libvirt URI (e.g. qemu+ssh://root@host/system)")
        self.emulated = uri.startswith("test:")
        self.boots_guests = not self.emulated
        self.moves_suspended = not self.options.get("shared_storage")  # (moving.py: not yet there)
        self._check_options()

    def _check_options(self):
        domain_type, cpu_mode = self._domain_type(), self.options.get("cpu_mode")
        if not isinstance(domain_type, str) or not domain_type:  # libvirt itself refuses an unknown type
            raise Invalid(f"libvirt option domain_type {domain_type!r}: e.g. kvm or qemu")
        if cpu_mode is not None and not (
            cpu_mode in CPU_MODES or (isinstance(cpu_mode, str) and cpu_mode.startswith("custom:") and cpu_mode[7:])
        ):
            raise Invalid(f"libvirt option cpu_mode {cpu_mode!r}: one of {', '.join(CPU_MODES)} or custom:<model>")
        if domain_type == "qemu" and str(cpu_mode).startswith("host-"):
            raise Invalid(f"libvirt option cpu_mode {cpu_mode!r} needs domain_type kvm (emulation has no host CPU)")
        if vnc_listen_error(self._vnc_listen()):
            raise Invalid(f"libvirt option {vnc_listen_error(self._vnc_listen())}")
        if self.options.get("disk_cache", "none") not in DISK_CACHES:
            raise Invalid(f"libvirt option disk_cache {self.options['disk_cache']!r}: one of {', '.join(DISK_CACHES)}")
        for name in ("pool", "network"):
            value = self.options.get(name)
            if value is not None and (not isinstance(value, str) or not value or any(c in value for c in "<>&'\" \n")):
                raise Invalid(f"libvirt option {name} {value!r}: not a name")

    def _vnc_listen(self):
        return self.options.get("vnc_listen", "127.0.0.1")

    def _disk_cache(self):
        """``none`` (O_DIRECT) on KVM: what live migration over shared storage needs. Under
        software emulation, QEMU's default (the host page cache): an emulated guest reading
        its base image uncached spent ~2.7 CPU s more per boot of the test guest (9.6 vs 6.9,
        3 at once), which made 3 reservations at once ~1.7x slower than the raw boot."""
        cache = self.options.get("disk_cache", "none" if self._domain_type() == "kvm" else "default")
        return None if cache == "default" else cache

    def _cpu_mode(self):
        mode = self.options.get("cpu_mode", "host-model" if self._domain_type() == "kvm" else "none")
        return None if mode == "none" else mode  # host-model: migratable between unlike hosts, unlike passthrough

    # --- plumbing -------------------------------------------------------------------------

    @property
    def conn(self):
        return connections.get(self.uri, self.credentials)

    def _call(self, context, fn, *args):
        try:
            return fn(*args)
        except libvirt.libvirtError as exc:
            raise translate(exc, context) from exc

    def _domain(self, key):
        base.check_key(key)
        return self._call(f"{key} on {self.host_name}", self.conn.lookupByName, key)

    def _find_domain(self, key):
        try:
            return self._domain(key)
        except NotFound:
            return None

    def _own_domain(self, key):
        """The domain ``key`` if it is this host's (see ``_elsewhere``), else None."""
        dom = self._find_domain(key)
        return None if dom is None or self._elsewhere(dom) else dom

    def _elsewhere(self, dom):
        """True when the domain's disk is in another storage pool of this libvirtd than the
        host's: two hosts sharing one libvirtd (two pools; the tests do) see each other's
        domains, and a domain belongs to the host whose pool holds its disk."""
        wanted = self.options.get("pool")
        if not wanted:
            return False  # the host has the libvirtd's pool to itself
        disk = f"{dom.name()}.qcow2"
        for path in domxml.disk_paths(self._call(f"definition of {dom.name()}", dom.XMLDesc, 0)):
            if os.path.basename(path) == disk:
                try:
                    return self.conn.storageVolLookupByPath(path).storagePoolLookupByVolume().name() != wanted
                except libvirt.libvirtError:
                    return False  # in no pool (any more): it cannot be another host's
        return False

    @property
    def host_name(self):
        if self.options.get("name"):
            return self.options["name"]
        path = urllib.parse.urlsplit(self.uri).path
        if self.emulated and path.endswith(".xml"):
            return os.path.splitext(os.path.basename(path))[0]
        try:
            return self.conn.getHostname()
        except libvirt.libvirtError:
            return urllib.parse.urlsplit(self.uri).hostname or self.uri

    def _pool(self):
        wanted = self.options.get("pool", "default")
        try:
            pool = self.conn.storagePoolLookupByName(wanted)
        except libvirt.libvirtError as exc:
            pools = self._call("list storage pools", self.conn.listAllStoragePools)
            if "pool" in self.options or len(pools) != 1:
                raise translate(exc, f"storage pool {wanted!r} on {self.host_name}") from exc
            pool = pools[0]
        if not pool.isActive():
            raise Conflict(f"storage pool {pool.name()} on {self.host_name} is not active")
        return pool

    def _volume(self, pool, name):
        try:
            return pool.storageVolLookupByName(name)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in NOT_FOUND:
                return None
            raise translate(exc, f"volume {name}") from exc

    def _state(self, dom):
        state, _reason = self._call(f"state of {dom.name()}", dom.state)
        if state in (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED):
            return VMState.RUNNING
        if state in (libvirt.VIR_DOMAIN_PAUSED, libvirt.VIR_DOMAIN_PMSUSPENDED):
            return VMState.SUSPENDED
        if state in (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTDOWN):
            saved = self._call(f"state of {dom.name()}", dom.hasManagedSaveImage, 0)
            return VMState.SUSPENDED if saved else VMState.STOPPED
        return VMState.ERROR

    def _paused(self, dom):
        return dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED

    # --- host -----------------------------------------------------------------------------

    @translated
    def facts(self):
        conn = self.conn
        model, memory_mib, cpus, mhz, *_ = self._call("node info", conn.getInfo)
        pool = self._pool()
        if not self.emulated:
            self._call("refresh pool", pool.refresh, 0)
        _state, capacity, _allocation, available = self._call("pool info", pool.info)
        domains = self._call("list domains", conn.listAllDomains)
        running = [dom for dom in domains if dom.isActive()]
        try:
            free_memory = conn.getFreeMemory() >> 20 or None  # the test driver reports 0: unknown
        except libvirt.libvirtError:
            free_memory = None
        return HostFacts(
            name=self.host_name,
            hypervisor_type=self.hypervisor_type,
            version=f"{conn.getType()} {_version(conn.getVersion())} (libvirt {_version(conn.getLibVersion())})",
            cpus=cpus,
            memory_mib=memory_mib,
            disk_gib=capacity // GIB,
            free_memory_mib=free_memory,
            free_disk_gib=available // GIB,
            vms=len(domains),
            running_vms=len(running),
            extra={"cpu_model": model, "cpu_mhz": mhz, "pool": pool.name(), "uri": self.uri},
            devices=gpus.host_devices(self),
        )

    @translated
    def list_vms(self):
        return [self._info(dom) for dom in self._call("list domains", self.conn.listAllDomains)]

    # --- images ---------------------------------------------------------------------------

    def _base_volume(self, pool, image):
        """The staged base volume of ``image`` on this host, or None."""
        vol = self._volume(pool, base.staged_name(image, f".{image.format}"))
        if vol is None and image.location.startswith("/"):
            try:  # already on the host's (shared) storage
                vol = self.conn.storageVolLookupByPath(image.location)
            except libvirt.libvirtError:
                vol = None
        return vol

    def _boot_name(self, image, role, file_spec):
        """The volume of a kernel or initrd: named after its disk's staged volume (so that
        unstaging the disk finds it) and its own content (checksum, else location)."""
        tag = base.staged_name(file_spec).rsplit("-", 1)[1]
        return f"{base.staged_name(image, f'.{image.format}')}.{role}-{tag}"

    def _boot_volumes(self, pool, image):
        """``{role: volume or None}`` of the image's kernel and initrd on this host (a
        location that is a volume of the host already is used as it is, like a disk)."""
        found = {}
        for role, file_spec in image.boot_files():
            vol = self._volume(pool, self._boot_name(image, role, file_spec))
            if vol is None and file_spec.location.startswith("/"):
                try:
                    vol = self.conn.storageVolLookupByPath(file_spec.location)
                except libvirt.libvirtError:
                    vol = None
            found[role] = vol
        return found

    def _seen_pool(self):
        """The pool, re-read from its directory when it is on shared storage: another host may
        have staged the image there since this libvirtd last listed it (it would then refuse
        to create a volume of that name: "already in use"). A pool busy with an upload of
        this libvirtd's is not re-read (libvirt refuses); it knows its own volumes."""
        pool = self._pool()
        if self.options.get("shared_storage"):
            try:
                pool.refresh(0)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_OPERATION_INVALID:
                    raise translate(exc, f"refresh storage pool {pool.name()} on {self.host_name}") from exc
        return pool

    @translated
    def stage_image(self, image):
        self.check_image(image)
        pool = self._seen_pool()
        boot = self._boot_volumes(pool, image)  # before the disk: a staged disk means a whole image
        for role, file_spec in image.boot_files():
            if boot[role] is None:
                self._upload_volume(pool, self._boot_name(image, role, file_spec), file_spec)
        existing = self._base_volume(pool, image)
        if existing is not None:
            return existing.path()
        return self._upload_volume(pool, base.staged_name(image, f".{image.format}"), image).path()

    def _upload_volume(self, pool, name, image):
        """``image``'s verified bytes as the volume ``name`` (uploaded under ``.part`` and
        copied into place, so a transfer cut short never looks staged)."""
        with base.fetched(image) as path:
            size = os.path.getsize(path)
            stale = self._volume(pool, name + ".part")
            if stale is not None:
                self._call("delete stale upload", stale.delete, 0)
            part_xml = domxml.volume_xml(name + ".part", size, image.format)
            part = self._call(f"create {name}.part", pool.createXML, part_xml, 0)
            try:
                self._upload(part, path, size)
                final = self._call(
                    f"create {name}", pool.createXMLFrom, domxml.volume_xml(name, size, image.format), part, 0
                )
            finally:
                part.delete(0)
        return final

    @translated
    def unstage_image(self, location):
        # The kernel and initrd staged with it first: a disk gone while they stay would leak them.
        prefix = os.path.basename(location)
        for vol in self._call("list volumes", self._pool().listAllVolumes, 0):
            if vol.name().startswith((f"{prefix}.kernel-", f"{prefix}.initrd-")):
                self._call(f"delete {vol.name()}", vol.delete, 0)
        try:
            vol = self.conn.storageVolLookupByPath(location)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in NOT_FOUND:
                return False
            raise translate(exc, f"volume {location}") from exc
        self._call(f"delete {location}", vol.delete, 0)
        return True

    def _upload(self, vol, path, size):
        with open(path, "rb") as handle:
            self._send(vol, iter(lambda: handle.read(1 << 20), b""), size)

    def _send(self, vol, chunks, size):
        stream = self.conn.newStream(0)
        try:
            vol.upload(stream, 0, size, 0)
        except libvirt.libvirtError as exc:
            if self.emulated and exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT:
                return  # the test driver keeps no volume content; the checksum was verified already
            raise translate(exc, f"upload to {vol.name()}") from exc
        try:
            for chunk in chunks:
                stream.send(chunk)
            stream.finish()
        except libvirt.libvirtError as exc:
            stream.abort()
            raise translate(exc, f"upload to {vol.name()}") from exc

    # --- lifecycle ------------------------------------------------------------------------

    @translated
    def create(self, spec):
        spec.validate()
        self.check_image(spec.image)
        dom = self._find_domain(spec.key)
        if dom is not None:
            return self._adopt(dom, spec)
        for key, _mac in spec.private_networks:
            if self._own_network(key) is None:
                raise NotFound(f"{spec.key}: no private network {key} on {self.host_name}; create it first")
        pool = self._pool()
        base_vol = self._base_volume(pool, spec.image)
        if base_vol is None:
            raise NotFound(f"image {spec.image.name} is not staged on {self.host_name}; stage it first")
        boot = self._boot_volumes(pool, spec.image)
        missing = sorted(role for role, vol in boot.items() if vol is None)
        if missing:
            raise NotFound(f"the {' and '.join(missing)} of image {spec.image.name} not staged on {self.host_name}")
        with gpus.choosing(self, spec):  # chosen and defined at once: two creates never pick one GPU
            passthrough = gpus.choose(self, spec)  # before anything is made: too few GPUs leave nothing behind
            overlay, made = self._overlay(pool, spec, base_vol)
            seed, mdevs = None, []
            try:
                seed = self._seed(pool, spec) if spec.guest is not None else None
                mdevs = gpus.make_mdevs(self, passthrough)
                network = self.options.get("network") or spec.network
                xml = domxml.domain_xml(
                    spec,
                    domain_type=self._domain_type(),
                    disk_path=overlay.path(),
                    cpu_mode=self._cpu_mode(),
                    disk_cache=self._disk_cache(),
                    seed_path=seed.path() if seed is not None else None,
                    network=network,
                    seed_digest=cloudinit.seed_digest(cloudinit.seed_files(spec.guest)) if spec.guest else None,
                    forward_port=_free_port() if network == domxml.USER_NETWORK else None,
                    vnc_listen=None if self._vnc_listen() == "none" else self._vnc_listen(),
                    hostdevs=nodedev.hostdev_elements(passthrough),
                    kernel=boot["kernel"].path() if "kernel" in boot else None,
                    initrd=boot["initrd"].path() if "initrd" in boot else None,
                    cmdline=spec.image.kernel_args,
                )
                dom = self._call(f"define {spec.key}", self.conn.defineXML, xml)
            except (DriverError, cloudinit.SeedError) as exc:
                existing = self._find_domain(spec.key)  # a concurrent create won the race
                if existing is not None:
                    return self._adopt(existing, spec)
                gpus.remove(self, mdevs)
                if seed is not None:
                    seed.delete(0)
                if made:
                    overlay.delete(0)  # no orphan disk
                if isinstance(exc, cloudinit.SeedError):
                    raise Invalid(f"{spec.key}: {exc}") from None
                raise
        return self._info(dom)

    def _seed(self, pool, spec):
        """The NoCloud seed volume of the VM, written afresh (one left by an attempt that died
        before defining the domain may hold another login)."""
        return self._write_seed(pool, spec.key, spec.guest)

    def _write_seed(self, pool, key, guest):
        data = cloudinit.seed_iso(cloudinit.seed_files(guest))
        name = f"{key}-seed.iso"
        stale = self._volume(pool, name)
        if stale is not None:
            self._call(f"delete stale seed of {key}", stale.delete, 0)
        vol = self._call(f"create seed of {key}", pool.createXML, domxml.volume_xml(name, len(data), "raw"), 0)
        try:
            self._send(vol, [data], len(data))
        except BaseException:
            vol.delete(0)
            raise
        return vol

    def _adopt(self, dom, spec):
        if domxml.metadata_of(dom.XMLDesc(0)).get("fingerprint") != spec.fingerprint():
            raise Conflict(f"a VM named {spec.key} already exists on {self.host_name} and was not made by this request")
        return self._info(dom)

    def _overlay(self, pool, spec, base_vol):
        name = f"{spec.key}.qcow2"
        vol = self._volume(pool, name)
        if vol is not None:
            return vol, False  # left by an attempt that died before defining the domain
        _type, capacity, _allocation = base_vol.info()
        fmt = domxml.ET.fromstring(base_vol.XMLDesc(0)).find("target/format")
        xml = domxml.volume_xml(
            name,
            max(capacity, spec.disk_gib * GIB),
            "qcow2",
            base_vol.path(),
            fmt.get("type") if fmt is not None else spec.image.format,
        )
        return self._call(f"create disk of {spec.key}", pool.createXML, xml, 0), True

    def _domain_type(self):
        if "domain_type" in self.options:
            return self.options["domain_type"]
        return "test" if self.emulated else "kvm"

    def _info(self, dom):
        _state, _max, memory_kib, vcpus, _cpu = self._call(f"info of {dom.name()}", dom.info)
        name = dom.name()
        return VMInfo(name, self._state(dom), self.host_name, vcpus, memory_kib // 1024, base.is_managed(name))

    # --- private networks (netxml.py) ---------------------------------------------------------

    def _network(self, key):
        """The libvirt network named ``key``, or None."""
        base.check_key(key)
        try:
            return self.conn.networkLookupByName(key)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in NOT_FOUND:
                return None
            raise translate(exc, f"network {key} on {self.host_name}") from exc

    def _own_network(self, key):
        """The network ``key`` if vclmgr made it (its metadata says so), else None."""
        net = self._network(key)
        if net is None or not netxml.network_metadata(self._call(f"definition of {key}", net.XMLDesc, 0)):
            return None
        return net

    def _network_info(self, net):
        mine = netxml.network_metadata(self._call(f"definition of {net.name()}", net.XMLDesc, 0))
        return NetworkInfo(net.name(), mine.get("cidr", ""), bool(mine))

    @translated
    def create_network(self, spec):
        spec.validate()
        net = self._network(spec.key)
        if net is None:
            try:
                net = self._call(f"define network {spec.key}", self.conn.networkDefineXML, netxml.network_xml(spec))
            except DriverError:
                net = self._network(spec.key)  # a concurrent create won the race: judged below
                if net is None:
                    raise
        mine = netxml.network_metadata(self._call(f"definition of {spec.key}", net.XMLDesc, 0))
        if mine.get("fingerprint") != spec.fingerprint():
            raise base.network_conflict(spec.key, self.host_name)
        if not net.isActive():
            try:
                self._call(f"start network {spec.key}", net.create)
            except Conflict:
                # The members of an environment are built at once: another one's build may
                # start the network between these calls, which is what was asked.
                if not self._call(f"state of network {spec.key}", net.isActive):
                    raise
        self._call(f"autostart network {spec.key}", net.setAutostart, 1)  # back after the host reboots
        return self._network_info(net)

    @translated
    def delete_network(self, key):
        net = self._network(key)
        if net is None:
            return False
        if not netxml.network_metadata(self._call(f"definition of {key}", net.XMLDesc, 0)):
            raise Conflict(f"network {key} on {self.host_name} was not made by vclmgr: left alone")
        users = [dom.name() for dom in self._call("list domains", self.conn.listAllDomains) if self._uses(dom, key)]
        if users:
            raise Conflict(f"network {key} on {self.host_name} is still used by {', '.join(sorted(users))}")
        # The members of an environment are torn down at once: another one's teardown may
        # remove the network between these calls, which is what was asked.
        try:
            if self._call(f"state of network {key}", net.isActive):
                self._call(f"stop network {key}", net.destroy)
            self._call(f"undefine network {key}", net.undefine)
        except NotFound:
            return False
        return True

    def _uses(self, dom, network_key):
        """True when domain ``dom`` has a NIC on ``network_key`` (False once it is undefined)."""
        try:
            return network_key in domxml.networks_of(self._call(f"definition of {dom.name()}", dom.XMLDesc, 0))
        except NotFound:
            return False

    @translated
    def list_networks(self):
        nets = self._call("list networks", self.conn.listAllNetworks)
        return [info for info in map(self._network_info, nets) if info.managed]

    @translated
    def start(self, key):
        dom = self._domain(key)
        if not base.needs("start", key, self._state(dom)):
            return
        if self._paused(dom):
            self._call(f"resume {key}", dom.resume)
        else:  # shut off, or managed-saved (create() restores the saved memory)
            gpus.start_mdevs(self, self._call(f"definition of {key}", dom.XMLDesc, 0))
            self._call(f"start {key}", dom.create)

    @translated
    def stop(self, key, force=False):
        dom = self._domain(key)
        if not base.needs("stop", key, self._state(dom), force):
            return
        if force:
            if dom.isActive():
                self._call(f"power off {key}", dom.destroy)
            if dom.hasManagedSaveImage(0):
                self._call(f"discard saved memory of {key}", dom.managedSaveRemove, 0)
            return
        self._call(f"shut down {key}", dom.shutdown)  # ACPI: the guest decides when
        base.wait_until(
            lambda: not dom.isActive(), f"shutdown of {key} (stop it with force)", self.options.get("stop_timeout", 120)
        )

    @translated
    def suspend(self, key):
        dom = self._domain(key)
        if base.needs("suspend", key, self._state(dom)):
            self._call(f"suspend {key}", dom.managedSave, 0)  # memory to disk: the host's RAM is freed

    @translated
    def resume(self, key):
        dom = self._domain(key)
        if base.needs("resume", key, self._state(dom)):
            self.start(key)

    @translated
    def destroy(self, key):
        dom = self._own_domain(key)
        if dom is not None:
            vgpus = nodedev.used_by(self._call(f"definition of {key}", dom.XMLDesc, libvirt.VIR_DOMAIN_XML_INACTIVE))[1]
            if dom.isActive():
                self._call(f"power off {key}", dom.destroy)
            flags = libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
            try:
                dom.undefineFlags(flags)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() not in NOT_FOUND:
                    raise translate(exc, f"undefine {key}") from exc
            gpus.remove(self, sorted(vgpus))  # once the domain no longer holds them
        pool = self._pool()
        names = ((f"{key}.qcow2", "disk"), (f"{key}-seed.iso", "seed"), (moving.save_name(key), "saved memory"))
        for name, what in names:
            vol = self._volume(pool, name)
            if vol is not None:  # also after a create that died between disk and definition
                self._call(f"delete {what} of {key}", vol.delete, 0)

    @translated
    def snapshot(self, key, name):
        base.check_snapshot_name(name)
        dom = self._domain(key)
        if name in self._call(f"snapshots of {key}", dom.snapshotListNames, 0):
            return
        self._call(f"snapshot {key}", dom.snapshotCreateXML, domxml.snapshot_xml(name), 0)

    @translated
    def revert(self, key, name):
        base.check_snapshot_name(name)
        dom = self._domain(key)
        snap = self._call(f"snapshot {name!r} of {key}", dom.snapshotLookupByName, name, 0)
        self._call(f"revert {key} to {name!r}", dom.revertToSnapshot, snap, 0)
        if dom.isActive():  # resumed from memory: the guest's clock is the snapshot's; its agent re-reads the RTC
            try:
                dom.setTime(None, libvirt.VIR_DOMAIN_TIME_SYNC)
            except libvirt.libvirtError as exc:  # no agent (yet): the clock catches up by itself (NTP)
                log.info("%s: guest clock not synced after the revert: %s", key, exc)

    @translated
    def reseed(self, key, guest):
        """Write the stopped VM's seed volume afresh for ``guest`` and point its CD-ROM at it
        (None: delete the volume and empty the tray). The domain's metadata names the seed's
        instance id; a revert restores the snapshot's definition, so a reseed follows it."""
        dom = self._domain(key)
        xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        base.check_reseed(key, self._state(dom), None, None, True)
        pool = self._pool()
        if guest is None:
            self._call(f"eject the seed of {key}", self.conn.defineXML, domxml.with_seed(xml, None, None, None))
            vol = self._volume(pool, f"{key}-seed.iso")
            if vol is not None:  # it holds the last user's password hash
                self._call(f"delete seed of {key}", vol.delete, 0)
            return
        try:
            digest = cloudinit.seed_digest(cloudinit.seed_files(guest))
        except cloudinit.SeedError as exc:
            raise Invalid(f"{key}: {exc}") from None
        mine = domxml.metadata_of(xml)
        base.check_reseed(key, VMState.STOPPED, mine.get("instance"), guest, mine.get("seed") == digest)
        vol = self._write_seed(pool, key, guest)  # always: a revert may have left another seed in the volume
        new_xml = domxml.with_seed(xml, vol.path(), guest.instance_id, digest)
        self._call(f"reseed {key}", self.conn.defineXML, new_xml)

    @translated
    def resize(self, key, vcpus, memory_mib):
        """The persistent definition only (Ganeti's default): a running domain keeps its size
        until it next boots, and a managed save restores the size it was saved with."""
        base.check_size(key, vcpus, memory_mib)
        dom = self._domain(key)
        state = self._state(dom)
        xml = self._call(f"definition of {key}", dom.XMLDesc, libvirt.VIR_DOMAIN_XML_INACTIVE)
        if domxml.size_of(xml) != (vcpus, memory_mib):
            try:
                new_xml = domxml.with_size(xml, vcpus, memory_mib)
            except ValueError as exc:
                raise Invalid(f"cannot resize {key}: {exc}") from None
            self._call(f"resize {key}", self.conn.defineXML, new_xml)
        return base.applies(state)

    @translated
    def capture(self, key, new_image_name):
        base.check_image_name(new_image_name)
        dom = self._domain(key)
        if self._state(dom) != VMState.STOPPED:
            raise Conflict(f"cannot capture {key}: it is {self._state(dom)}; stop it first")
        pool = self._pool()
        name = f"{new_image_name}.qcow2"
        vol = self._volume(pool, name)
        if vol is None:
            disk = self._volume(pool, f"{key}.qcow2")
            if disk is None:
                raise NotFound(f"the disk of {key} ({key}.qcow2) is not in pool {pool.name()}")
            _type, capacity, _allocation = disk.info()
            vol = self._call(f"capture {key}", pool.createXMLFrom, domxml.volume_xml(name, capacity, "qcow2"), disk, 0)
        _type, capacity, _allocation = vol.info()
        boot = self._capture_boot(dom, pool, new_image_name)
        return base.ImageVariantSpec(
            name=new_image_name, format="qcow2", location=vol.path(), size_gib=-(-capacity // GIB), **boot
        )

    def _capture_boot(self, dom, pool, new_image_name):
        """The kernel settings of a VM that boots a kernel directly, for the image captured from
        it: its kernel and initrd copied beside the captured disk (the staged ones go when their
        image leaves the host's cache), and its command line."""
        xml = self._call(f"definition of {dom.name()}", dom.XMLDesc, libvirt.VIR_DOMAIN_XML_INACTIVE)
        boot = domxml.kernel_boot(xml)
        if not boot:
            return {}
        captured = {"kernel_args": boot["cmdline"]}
        for role in ("kernel", "initrd"):
            if not boot[role]:
                continue
            name = f"{new_image_name}.{role}"
            vol = self._volume(pool, name)
            if vol is None:
                source = self._call(f"{role} of {dom.name()}", self.conn.storageVolLookupByPath, boot[role])
                _type, size, _allocation = source.info()
                xml = domxml.volume_xml(name, size, "raw")
                vol = self._call(f"capture the {role} of {dom.name()}", pool.createXMLFrom, xml, source, 0)
            captured[role] = vol.path()
        return captured

    @translated
    def migrate(self, key, target):
        self._same_kind(target)
        self._check_no_gpus(key)
        dom = self._find_domain(key)
        if dom is not None:
            self._check_networks_on(dom, target)
        if not (self.emulated or target.emulated) and moving.wanted(self, target, key):
            moving.move(self, target, key)  # suspended: its saved memory moves through the pools
            return
        dom = self._find_domain(key)
        if dom is None:
            if target._find_domain(key) is not None:
                return  # moved already (a retried migrate)
            raise NotFound(f"no VM {key} on {self.host_name}")
        running = dom.isActive()
        if not (running or self.emulated or target.emulated or self.options.get("shared_storage")):
            copying.move_stopped(self, target, key)
            return None
        boot = self.boot_paths_on(target, self._call(f"definition of {key}", dom.XMLDesc, 0))
        if self.emulated and target.emulated:  # the test driver migrates nothing (not even offline)
            self._emulate_migration(dom, target, boot)
            return None
        return live.migrate(self, target, dom, boot)

    def _check_networks_on(self, dom, target):
        """A member of a private network moves only to a host that has that network too (there
        is no overlay between hosts: on any other, its NIC would reach nobody)."""
        for net in sorted(domxml.networks_of(self._call(f"definition of {dom.name()}", dom.XMLDesc, 0))):
            if base.VM_KEY_RE.match(net) and self._own_network(net) and target._own_network(net) is None:
                raise Conflict(
                    f"{dom.name()} is on private network {net}, which {target.host_name} does not have: "
                    "the members of a private network share a host"
                )

    def _check_no_gpus(self, key):
        """A VM holding this host's GPUs cannot move: libvirt migrates no PCI or mediated device,
        and the target's devices have other addresses."""
        dom = self._find_domain(key)
        if dom is None:
            return
        pci, vgpus = nodedev.used_by(self._call(f"definition of {key}", dom.XMLDesc, 0))
        if pci or vgpus:
            raise Invalid(
                f"{key} has {len(pci) + len(vgpus)} GPU device(s) of {self.host_name} passed through and cannot "
                "move to another host: end it and build it again there"
            )

    def boot_paths_on(self, target, xml):
        """``{path here: path on target}`` of the kernel and initrd a domain boots (its XML
        ``xml``): the volumes of the same names in the target's pool, staged there with the
        image (or the same path where the target has it: shared storage). Raises NotFound
        when the target lacks one."""
        boot = domxml.kernel_boot(xml)
        paths = {}
        for role in ("kernel", "initrd"):
            path = boot.get(role)
            if not path:
                continue
            vol = target._volume(target._pool(), os.path.basename(path))
            if vol is None:
                try:
                    vol = target.conn.storageVolLookupByPath(path)
                except libvirt.libvirtError:
                    vol = None
            if vol is None:
                raise NotFound(f"the {role} {os.path.basename(path)} is not staged on {target.host_name}")
            if vol.path() != path:
                paths[path] = vol.path()
        return paths

    def _emulate_migration(self, dom, target, boot=None):
        """Cold move for the test driver: disk, definition, snapshots, then power state."""
        key = dom.name()
        disk = self._volume(self._pool(), f"{key}.qcow2")
        target_pool = target._pool()
        if disk is not None and target._volume(target_pool, disk.name()) is None:
            target._call(f"copy disk of {key}", target_pool.createXML, disk.XMLDesc(0), 0)
        xml = domxml.repathed(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE), boot or {})
        moved = target._call(f"define {key}", target.conn.defineXML, xml)
        for snap in dom.listAllSnapshots(libvirt.VIR_DOMAIN_SNAPSHOT_LIST_TOPOLOGICAL):
            if snap.getName() not in moved.snapshotListNames(0):
                target._call(
                    f"copy snapshot of {key}",
                    moved.snapshotCreateXML,
                    domxml.repathed(snap.getXMLDesc(0), boot or {}),
                    libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE,
                )
        if dom.isActive():
            target._call(f"start {key} on {target.host_name}", moved.create)
        elif dom.hasManagedSaveImage(0):  # its memory goes with it (the test driver keeps it in the process)
            target._call(f"start {key} on {target.host_name}", moved.create)
            target._call(f"suspend {key} on {target.host_name}", moved.managedSave, 0)
        self.destroy(key)

    @translated
    def address(self, key):
        dom = self._domain(key)
        if not dom.isActive() or self._paused(dom):
            return None
        if _forward_port(dom):
            return "127.0.0.1"  # user-mode networking: the guest is reached through the host's forward
        # An environment's machine also has a lease (and the agent an address) on each private
        # network, which its user cannot reach: only its primary NIC's address is its own.
        primary = domxml.primary_mac(self._call(f"definition of {key}", dom.XMLDesc, 0), key)
        sources = [libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT]
        for source in sources:
            try:
                interfaces = dom.interfaceAddresses(source, 0) or {}
            except libvirt.libvirtError:
                continue  # no agent, or the driver cannot tell: try the next source
            for iface in interfaces.values():
                if primary and (iface.get("hwaddr") or "").lower() != primary:
                    continue
                for addr in iface.get("addrs") or []:
                    if addr.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 and not addr["addr"].startswith("127."):
                        return addr["addr"]
        return None

    @translated
    def state(self, key):
        try:
            dom = self._own_domain(key)
            return VMState.ABSENT if dom is None else self._state(dom)
        except NotFound:  # undefined between the lookup and the reads (a teardown running beside)
            return VMState.ABSENT

    @translated
    def port(self, key, guest_port):
        return _forward_port(self._domain(key)) or guest_port

    @translated
    def console_address(self, key):
        dom = self._domain(key)
        if not dom.isActive():
            raise base.NoConsole(f"{key} is not running: its display is there while it runs")
        found = domxml.vnc_port(dom.XMLDesc(0))
        if found is None:
            raise base.NoConsole(f"{key} has no VNC display (made before the console existed, or vnc_listen is none)")
        address, port = found
        loopback = address in ("127.0.0.1", "::1", "localhost")
        if address in ("0.0.0.0", "::"):  # every address of the host: reach it by the URI's host
            address = urllib.parse.urlsplit(self.uri).hostname or "127.0.0.1"
        elif loopback and not _local(self.uri):
            raise base.NoConsole(
                f"{key}'s display listens on {self.host_name}'s loopback, which vclmgr does not reach from here: "
                "set the host's vnc_listen option to an address on a management network"
            )
        return address, port

    @translated
    def serial_console(self, key):
        base.check_key(key)
        # The stream's own connection (open_own says why); libvirt's test driver keeps its world
        # per connection, so there the pooled one is the only one that knows the domain.
        own = not self.emulated
        conn = open_own(self.uri, self.credentials) if own else self.conn
        try:
            dom = self._call(f"{key} on {self.host_name}", conn.lookupByName, key)
            if not dom.isActive():
                raise base.NoConsole(f"{key} is not running: its serial console is there while it runs")
            stream = self._call(f"console stream of {key}", conn.newStream, 0)
            # FORCE: a second viewer takes the console over from the first (virsh console's --force);
            # the first one's stream then ends.
            self._call(f"serial console of {key}", dom.openConsole, None, stream, libvirt.VIR_DOMAIN_CONSOLE_FORCE)
        except BaseException:
            if own:
                _close_quietly(conn)
            raise
        return SerialStream(stream, key, conn if own else None)

    @translated
    def agent_answers(self, key):
        """The QEMU guest agent's ``guest-ping`` through libvirt (its virtio channel); False
        until the agent in the guest is up."""
        import libvirt_qemu  # ships with libvirt-python; only this call needs it

        dom = self._domain(key)
        if not dom.isActive():
            return False
        try:
            libvirt_qemu.qemuAgentCommand(dom, '{"execute":"guest-ping"}', 2, 0)
        except libvirt.libvirtError:
            return False
        return True

    # --- the guest command channel, through the guest agent (libvirt/agent.py) ------------------

    def _agent_domain(self, key):
        dom = self._domain(key)
        if not dom.isActive():
            raise base.Conflict(f"{key} is not running: its guest agent cannot answer")
        return dom

    @translated
    def guest_exec(self, key, tag, argv, env=None, workdir="/"):
        agent.start(self._agent_domain(key), tag, list(argv), dict(env or {}), workdir)

    @translated
    def guest_exec_status(self, key, tag, offset=0, limit=1 << 20):
        return agent.status(self._agent_domain(key), tag, offset, limit)

    @translated
    def guest_put_file(self, key, path, data):
        agent.put(self._agent_domain(key), path, bytes(data))

    @translated
    def guest_get_file(self, key, path, limit):
        return agent.get(self._agent_domain(key), path, limit)

    @translated
    def guest_glob(self, key, directory, patterns):
        return agent.glob(self._agent_domain(key), directory, list(patterns))

    @translated
    def personalise(self, key, guest):
        try:
            agent.command(self._agent_domain(key), "guest-ping", timeout=2)
        except libvirt.libvirtError as exc:
            raise DriverError(f"{key}: the guest agent does not answer: {exc}", permanent=False) from exc
        agent.personalise(self._agent_domain(key), guest)

    @translated
    def guest_sessions(self, key):
        """The guest's logins from the QEMU guest agent's ``guest-get-users`` (through libvirt's
        guest info: user, login time in ms); the agent cannot tell idle time."""
        dom = self._domain(key)
        if not dom.isActive() or self._paused(dom):
            raise Conflict(f"{key} is not running: nobody can be logged in")
        try:
            info = dom.guestInfo(libvirt.VIR_DOMAIN_GUEST_INFO_USERS, 0)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT:
                raise Invalid(f"{self.uri} cannot read guest logins (no guest info support)") from exc
            # No agent channel, agent not up yet or gone: only the guest can fix that, a retry may see it.
            raise DriverError(f"{key}: the guest agent did not list logins: {exc}", permanent=False) from exc
        sessions = []
        for i in range(int(info.get("user.count", 0))):
            login_ms = info.get(f"user.{i}.login-time")
            sessions.append(
                base.GuestSession(
                    user=str(info.get(f"user.{i}.name", "?")),
                    login_time=login_ms / 1000 if login_ms is not None else None,
                )
            )
        return sessions


class SerialStream:
    """A domain's console stream: blocking reads (one reader thread), writes from any thread."""

    def __init__(self, stream, key, conn=None):
        self.stream, self.key, self.conn = stream, key, conn  # conn: its own, closed with it
        self.closed = False

    def read(self):
        if self.closed:
            return b""
        try:
            data = self.stream.recv(4096)
        except libvirt.libvirtError:  # closed by close(), by a forcing viewer, or the domain stopped
            return b""
        return data if isinstance(data, bytes) else b""

    def write(self, data):
        try:
            self.stream.send(data)
        except libvirt.libvirtError as exc:
            raise base.NoConsole(f"the serial console of {self.key} closed: {exc}") from None

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                self.stream.abort()  # also ends a read() waiting in another thread
            except libvirt.libvirtError:
                pass
            if self.conn is not None:
                _close_quietly(self.conn)


def _close_quietly(conn):
    try:
        conn.close()
    except libvirt.libvirtError:
        pass


def _local(uri):
    """True when a libvirt URI reaches a daemon on this machine (so its loopback is ours)."""
    parts = urllib.parse.urlsplit(uri)
    transport = parts.scheme.partition("+")[2]
    return transport in ("", "unix") and parts.hostname in (None, "", "localhost", "127.0.0.1")


def _forward_port(dom):
    port = domxml.metadata_of(dom.XMLDesc(0)).get("port")
    return int(port) if port else None


def _free_port():
    # QEMU binds it when the domain starts; a port taken meanwhile fails the start, which the
    # create job retries (the retry defines the VM afresh with another port).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _version(number):
    major, rest = divmod(number, 1_000_000)
    return f"{major}.{rest // 1000}.{rest % 1000}"
