"""The simulated hypervisor: the embedded default, and the peer for fault-injection tests.

``SimDriver("sim://<host>", options={...})`` drives the SimHost of that name (created on
first use with ``options`` cpus / memory_mib / disk_gib / dhcp_pool; ``options["gpus"]``, model →
count, is reported as its devices). Every call:

1. applies the fault injected for this host and step, if any (see ``services.set_fault``);
2. sleeps the step delay: ``options["delay"]`` seconds, or ``{"<step>": seconds}`` per step
   (small in the demo, zero in tests);
3. changes state in one short transaction, locking the VM row, so concurrent workers in any
   process see one consistent host. Nothing sleeps inside a transaction. With no fault and no
   delay, the fault is read with the rows the call reads anyway, and a create or a power change
   is one statement (an ``INSERT … SELECT``; an UPDATE conditional on the row as read, which
   goes the locked way when the row changed meanwhile).

It runs any image format (it emulates), leases addresses from the host's DHCP pool when a VM
first boots, keeps the lease until the VM is destroyed, and verifies the checksum of images
staged from local files.

Private networks (``SimNetwork``) belong to one host (one spread over hosts of an overlay is
a row on each, one address space across them): a VM's NIC on one (``SimNIC``) is given
its address when the VM is made (a member's fixed one, by MAC; else the lowest free one of the
rest of the range), a VM on a network its host lacks is refused, a network in use is not
deleted, and a VM with private NICs does not migrate (its network stays on the host). Two
networks of one host may not overlap, as libvirt refuses a range a bridge already has.
"""

import contextlib
import hashlib
import ipaddress
import json
import secrets
import time
import urllib.parse

from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, Q, Subquery, Sum, TextField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from drivers import base, cloudinit
from drivers.base import (
    Conflict,
    DriverError,
    HostFacts,
    Invalid,
    NetworkInfo,
    NetworkSpec,
    NotFound,
    Unreachable,
    VMInfo,
    VMState,
)
from drivers.sim import guest, services, steps
from drivers.sim.models import SimFault, SimHost, SimImage, SimNetwork, SimNIC, SimVM

VERSION = "vclmgr-sim 1"
HANG_POLL_SECONDS = 0.2


class SimDriver(base.Driver):
    kind = "sim"
    moves_suspended = True  # a simulated VM moves with its state
    supports_networks = True

    def __init__(self, uri, credentials=None, options=None):
        super().__init__(uri, credentials, options)
        parts = urllib.parse.urlsplit(uri or "")
        self.host_name = parts.netloc or parts.path.strip("/")
        if parts.scheme != "sim" or not self.host_name or "/" in self.host_name:
            raise Invalid(f"{uri!r} is not a sim URI (sim://<host name>)")
        self._host = None

    # --- plumbing -------------------------------------------------------------------------

    def host(self):
        if self._host is None:
            host = SimHost.objects.filter(name=self.host_name).first()
            if host is None:
                fields = ("cpus", "memory_mib", "disk_gib", "dhcp_pool")
                capacity = {field: self.options[field] for field in fields if field in self.options}
                host = services.ensure_host(self.host_name, **capacity, reason="first use by the sim driver")
            self._host = host
        return self._host

    def _step(self, step):
        """Apply this host's injected fault for ``step``, then the configured delay."""
        fault_id = self._fault_id(step)
        fault = SimFault.objects.filter(pk=fault_id).first() if fault_id is not None else None
        if fault is not None:
            self._apply(fault, step)
        delay = self._delay(step)
        if delay:
            time.sleep(delay)

    def _delay(self, step):
        delay = self.options.get("delay", 0)
        return float(delay.get(step, 0) if isinstance(delay, dict) else delay)

    def _faults(self, step):
        """The host's fault for ``step`` first (then one for any step), as a query of ids."""
        return SimFault.objects.filter(step__in=[step, steps.ANY]).order_by("-step").values("pk")

    def _fault_id(self, step):
        """The id of this host's fault for ``step``, or None; on a driver's first call the host's
        row is read with it (every call needs both, and most drivers make one call)."""
        faults = self._faults(step)
        if self._host is None:
            host = (
                SimHost.objects.filter(name=self.host_name)
                .annotate(fault_id=Subquery(faults.filter(host=OuterRef("pk"))[:1]))
                .first()
            )
            if host is not None:
                self._host = host
                return host.fault_id
        return faults.filter(host=self.host()).values_list("pk", flat=True).first()

    def _apply(self, fault, step):
        where = f"{self.host_name}/{step}"
        if fault.mode == SimFault.Mode.FAIL:
            raise DriverError(f"injected failure on {where}", permanent=True)
        if fault.mode == SimFault.Mode.UNREACHABLE:
            raise Unreachable(f"{self.host_name} unreachable (injected on {where})")
        if fault.mode == SimFault.Mode.FAIL_ONCE:
            consumed, _ = SimFault.objects.filter(pk=fault.pk, mode=SimFault.Mode.FAIL_ONCE).delete()
            if consumed:  # exactly one caller, in whichever process, gets the failure
                raise DriverError(f"injected one-time failure on {where}", permanent=False)
        elif fault.mode == SimFault.Mode.SLOW:
            time.sleep(fault.seconds or 0)
        elif fault.mode == SimFault.Mode.HANG:
            limit = fault.seconds if fault.seconds is not None else self.options.get("hang_seconds", 3600)
            deadline = time.monotonic() + limit
            while time.monotonic() < deadline:
                time.sleep(min(HANG_POLL_SECONDS, max(0, deadline - time.monotonic())))
                if not SimFault.objects.filter(pk=fault.pk, mode=SimFault.Mode.HANG).exists():
                    return  # cleared while we waited: answer now
            raise Unreachable(f"{self.host_name} did not answer {step} within {limit:g} s (injected hang)")

    def _quiet(self, step, rows, host="host_id", **annotations):
        """The first of ``rows`` (of a model with a ``host``) annotated with ``annotations`` and
        the host's fault id for ``step``, when no fault is injected there and no delay is set
        for it: what ``_step`` then the read would have found, in one statement. None otherwise
        (no row, a fault, a delay): the caller goes the usual way (``_step``, then its reads),
        outside any transaction, as a fault's sleep or hang must be."""
        if self._delay(step):
            return None
        faults = Subquery(self._faults(step).filter(host=OuterRef(host))[:1])
        row = rows.annotate(fault_id=faults, **annotations).first()
        return row if row is not None and row.fault_id is None else None

    def _quiet_vm(self, key, step, lock=False, **annotations):
        """``_step(step)`` then ``_vm(key, lock)`` in one read (the VM with its host and the
        fault, and ``annotations``), or None (see ``_quiet``)."""
        base.check_key(key)
        rows = SimVM.objects.select_for_update(of=("self",)) if lock else SimVM.objects
        rows = rows.select_related("host").filter(key=key, host__name=self.host_name)
        vm = self._quiet(step, rows, **annotations)
        if vm is not None:
            self._host = vm.host
        return vm

    def _changed(self, key, step, change):
        """``_step(step)``, then ``change(vm, save)`` of the VM's row (``save``: how it writes).
        The quiet way, when no delay is set for ``step``: the VM is read with its fault, and
        with none injected written by one UPDATE conditional on the row still holding what was
        read of it (``_swap``: no transaction, no lock). Otherwise, or when that cannot write
        (the row changed meanwhile, a JSON field to write, the address it leased taken), the
        fault is applied outside any transaction and the change made on the locked row in
        ``_leasing``'s transaction."""
        if not self._delay(step):
            powers_on = base.POWER_ACTIONS[step][0] == VMState.RUNNING  # it may lease an address
            vm = self._quiet_vm(key, step, **({"taken": _taken()} if powers_on else {}))
            if vm is not None:
                read = {name: getattr(vm, name) for name in _SWAPPED}
                try:
                    return change(vm, lambda vm, host, fields: _swap(read, vm, host, fields))
                except _NotQuiet:
                    pass
        self._step(step)
        return _leasing(lambda: change(self._vm(key, lock=True), _save))

    def _vm(self, key, lock=False):
        """This host's VM row, or NotFound."""
        base.check_key(key)
        rows = SimVM.objects.select_for_update() if lock else SimVM.objects
        vm = rows.filter(key=key, host=self.host()).first()
        if vm is None:
            raise NotFound(f"no VM {key} on {self.host_name}")
        return vm

    def _info(self, vm):
        return VMInfo(vm.key, VMState(vm.state), self.host_name, vm.vcpus, vm.memory_mib, base.is_managed(vm.key))

    def _power(self, action, key, force=False):
        """Apply one action of the power state machine (``base.needs``) to the VM row."""

        def change(vm, save):
            if not base.needs(action, key, VMState(vm.state), force):
                return
            before, vm.state = vm.state, base.POWER_ACTIONS[action][0]
            if vm.state != SimVM.State.RUNNING:
                vm.sessions = []  # a stopped guest has nobody logged in
            vm.guest = guest.paused(vm.guest, before, vm.state)
            save(vm, self.host(), ["state", "address", "sessions", "guest", "updated"])

        self._changed(key, action, change)

    # --- host -----------------------------------------------------------------------------

    def facts(self):
        self._step("facts")
        host = SimHost.objects.get(pk=self.host().pk)
        vms = SimVM.objects.filter(host=host)
        used = vms.aggregate(disk=Sum("disk_gib"), memory=Sum("memory_mib", filter=Q(state=SimVM.State.RUNNING)))
        images = SimImage.objects.filter(host=host).aggregate(disk=Sum("size_gib"))
        return HostFacts(
            name=host.name,
            hypervisor_type=self.hypervisor_type,
            version=VERSION,
            cpus=host.cpus,
            memory_mib=host.memory_mib,
            disk_gib=host.disk_gib,
            free_memory_mib=max(0, host.memory_mib - (used["memory"] or 0)),
            free_disk_gib=max(0, host.disk_gib - (used["disk"] or 0) - (images["disk"] or 0)),
            vms=vms.count(),
            running_vms=vms.filter(state=SimVM.State.RUNNING).count(),
            extra={"dhcp_pool": host.dhcp_pool},
            devices=self._devices(),
        )

    def _devices(self):
        """The GPUs this simulated host reports: its ``gpus`` option, model → count
        (``{"nvidia-a100": 2}``); none without it."""
        gpus = self.options.get("gpus") or {}
        return [
            {"kind": "gpu", "vendor": model.split("-", 1)[0], "model": model, "count": int(count)}
            for model, count in sorted(gpus.items())
        ]

    def discover(self):
        """Every simulated host (the simulator is one 'cluster')."""
        return [
            type(self)(f"sim://{name}", options=self.options).facts()
            for name in SimHost.objects.values_list("name", flat=True)
        ]

    def list_vms(self):
        self._step("list_vms")
        return [self._info(vm) for vm in SimVM.objects.filter(host=self.host())]

    # --- images ---------------------------------------------------------------------------

    def stage_image(self, image):
        self.check_image(image)
        self._step("stage_image")
        if base.local_path(image.location):  # bytes we can read: verify them like a real transfer
            with base.fetched(image):
                pass
        name = base.staged_name(image)
        SimImage.objects.get_or_create(
            host=self.host(),
            name=name,
            defaults={
                "format": image.format,
                "location": image.location,
                "checksum": image.checksum,
                "size_gib": image.size_gib,
            },
        )
        return f"sim://{self.host_name}/images/{name}"

    def unstage_image(self, location):
        prefix = f"sim://{self.host_name}/images/"
        if not location.startswith(prefix):
            raise base.Invalid(f"{location} is no image staged on {self.host_name}")
        deleted, _ = SimImage.objects.filter(host=self.host(), name=location[len(prefix) :]).delete()
        return bool(deleted)

    # --- lifecycle ------------------------------------------------------------------------

    def create(self, spec):
        spec.validate()
        staged = base.staged_name(spec.image)
        fingerprint = spec.fingerprint()
        fields = {
            "key": spec.key,
            "vcpus": spec.vcpus,
            "memory_mib": spec.memory_mib,
            "disk_gib": spec.disk_gib,
            "image": staged,
            "image_format": spec.image.format,
            "network": spec.network,
            "fingerprint": fingerprint,
            "seed": _seed(spec.key, spec.guest),
        }
        try:
            # The INSERT alone (a repeated create is the rare case): a savepoint only when a
            # caller's transaction must survive the duplicate key.
            with _own_savepoint():
                vm = None if spec.private_networks else self._inserted(fields, staged)
            if vm is None:  # a fault or a delay to apply, no such host or image, NICs: the usual way
                host = self._host_staged(spec.image, staged)
                with transaction.atomic():
                    vm = SimVM.objects.create(host=host, **fields)
                    _join(vm, host, spec.private_networks)
            created = True
        except IntegrityError:  # made by an earlier or a concurrent create of the same key: judge it below
            vm, created = SimVM.objects.filter(key=spec.key).first(), False
            if vm is None:  # not the key: a NIC's MAC or address on its network
                raise Conflict(
                    f"{spec.key}: another VM on its private network has its MAC or took its address"
                ) from None
        if not created and (vm.fingerprint != fingerprint or vm.host_id != self.host().pk):
            where = self.host_name if vm.host_id == self.host().pk else f"host {vm.host.name}"
            raise Conflict(f"a VM named {spec.key} already exists on {where} and was not made by this request")
        return self._info(vm)

    def _inserted(self, fields, staged):
        """The VM's row made by one INSERT … SELECT of this host, when no fault for create is
        injected there, no delay is set and its image is staged (what ``_step`` then the reads
        of the usual way would have found); None otherwise (nothing written)."""
        if self._delay("create"):
            return None
        hosts = (
            SimHost.objects.filter(name=self.host_name)
            .filter(
                ~Exists(self._faults("create").filter(host=OuterRef("pk"))),
                Exists(SimImage.objects.filter(host=OuterRef("pk"), name=staged)),
            )
            .values("pk")
        )
        select, select_params = hosts.query.sql_with_params()
        vm = SimVM(**fields)
        columns = [f for f in SimVM._meta.concrete_fields if not f.primary_key and f.name != "host"]
        values = [f.get_db_prep_save(f.pre_save(vm, add=True), connection) for f in columns]
        quote = connection.ops.quote_name
        names = ", ".join(quote(f.column) for f in [*columns, SimVM._meta.get_field("host")])
        sql = (
            f"INSERT INTO {quote(SimVM._meta.db_table)} ({names}) SELECT {', '.join(['%s'] * len(values))}, "
            f"{select.removeprefix('SELECT ')} RETURNING {quote('id')}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*values, *select_params])
            row = cursor.fetchone()
        if row is None:
            return None
        vm.pk, vm._state.adding, vm._state.db = row[0], False, connection.alias
        return vm

    def _host_staged(self, image, staged):
        """``_step("create")``, then this host, or ``NotFound`` when the image is not staged on it."""
        self._step("create")
        host = self.host()
        if not SimImage.objects.filter(host=host, name=staged).exists():
            raise NotFound(f"image {image.name} is not staged on {self.host_name}; stage it first")
        return host

    def start(self, key):
        self._power("start", key)

    def stop(self, key, force=False):
        self._power("stop", key, force)

    def suspend(self, key):
        self._power("suspend", key)

    def resume(self, key):
        self._power("resume", key)

    def destroy(self, key):
        base.check_key(key)
        self._step("destroy")
        SimVM.objects.filter(key=key, host=self.host()).delete()  # the lease goes with the row

    def snapshot(self, key, name):
        base.check_snapshot_name(name)
        self._step("snapshot")
        with transaction.atomic():
            vm = self._vm(key, lock=True)
            if any(snap["name"] == name for snap in vm.snapshots):
                return
            vm.snapshots = [*vm.snapshots, {"name": name, "state": vm.state, "created": time.time(), "seed": vm.seed}]
            vm.save(update_fields=["snapshots", "updated"])

    def revert(self, key, name):
        base.check_snapshot_name(name)
        self._step("revert")

        def change():
            vm = self._vm(key, lock=True)
            snap = next((snap for snap in vm.snapshots if snap["name"] == name), None)
            if snap is None:
                raise NotFound(f"{key} has no snapshot {name!r}")
            vm.state = snap["state"]
            vm.seed = snap.get("seed", vm.seed)  # as a real disk and definition are restored
            _save(vm, self.host(), ["state", "seed", "address", "updated"])

        _leasing(change)

    def reseed(self, key, guest):
        base.check_key(key)
        self._step("reseed")
        wanted = _seed(key, guest)
        with transaction.atomic():
            vm = self._vm(key, lock=True)
            base.check_reseed(key, VMState(vm.state), vm.seed.get("instance_id"), guest, vm.seed == wanted)
            if vm.seed == wanted:
                return
            vm.seed = wanted
            vm.save(update_fields=["seed", "updated"])

    def resize(self, key, vcpus, memory_mib):
        """The row is the simulated VM's definition; a running guest would see it at its next boot."""
        base.check_key(key)
        base.check_size(key, vcpus, memory_mib)
        self._step("resize")
        with transaction.atomic():
            vm = self._vm(key, lock=True)
            if (vm.vcpus, vm.memory_mib) != (vcpus, memory_mib):
                vm.vcpus, vm.memory_mib = vcpus, memory_mib
                vm.save(update_fields=["vcpus", "memory_mib", "updated"])
            return base.applies(VMState(vm.state))

    def capture(self, key, new_image_name):
        base.check_image_name(new_image_name)
        self._step("capture")
        vm = self._vm(key)
        if vm.state != SimVM.State.STOPPED:
            raise Conflict(f"cannot capture {key}: it is {vm.state}; stop it first")
        checksum = "sha256:" + hashlib.sha256(f"{self.host_name}/{key}/{new_image_name}".encode()).hexdigest()
        image = base.ImageVariantSpec(
            name=new_image_name,
            format=vm.image_format,
            location=f"sim://{self.host_name}/captured/{new_image_name}",
            checksum=checksum,
            size_gib=vm.disk_gib,
        )
        SimImage.objects.get_or_create(
            host=self.host(),
            name=base.staged_name(image),
            defaults={
                "format": image.format,
                "location": image.location,
                "checksum": checksum,
                "size_gib": image.size_gib,
                "captured_from": key,
            },
        )
        return image

    def migrate(self, key, target):
        self._same_kind(target)
        base.check_key(key)
        self._step("migrate")
        target._step("migrate")

        def change():
            vm = SimVM.objects.select_for_update().filter(key=key).first()
            if vm is not None and vm.host_id == target.host().pk:
                return  # already there (a retried migrate)
            if vm is None or vm.host_id != self.host().pk:
                raise NotFound(f"no VM {key} on {self.host_name}")
            if vm.nics.exists():
                raise Conflict(
                    f"{key} is on a private network of {self.host_name}: the members of a private network share a host"
                )
            vm.host = target.host()
            if vm.address and ipaddress.ip_address(vm.address) not in ipaddress.ip_network(vm.host.dhcp_pool):
                vm.address = None
            _save(vm, vm.host, ["host", "address", "updated"])

        _leasing(change)

    # --- private networks -------------------------------------------------------------------

    def create_network(self, spec):
        spec.validate()
        self._step("create_network")
        host = self.host()
        fields = {"cidr": str(spec.network), "hosts": [list(h) for h in spec.hosts], "fingerprint": spec.fingerprint()}
        if spec.overlay:
            fields.update(overlay=spec.overlay, segment=spec.segment, home=spec.home)
        with transaction.atomic():
            SimHost.objects.select_for_update().filter(pk=host.pk).first()  # one create of a host's networks at a time
            net = SimNetwork.objects.filter(host=host, key=spec.key).first()
            if net is None:
                overlapping = [
                    other.key
                    for other in SimNetwork.objects.filter(host=host)
                    if ipaddress.IPv4Network(other.cidr).overlaps(spec.network)
                ]
                if overlapping:
                    raise Conflict(f"network {spec.key}: {spec.cidr} overlaps {overlapping[0]} on {self.host_name}")
                net = SimNetwork.objects.create(host=host, key=spec.key, **fields)
        if net.fingerprint != spec.fingerprint():
            raise base.network_conflict(spec.key, self.host_name)
        return NetworkInfo(net.key, net.cidr)

    def delete_network(self, key):
        base.check_key(key)
        self._step("delete_network")
        with transaction.atomic():
            net = SimNetwork.objects.select_for_update().filter(host=self.host(), key=key).first()
            if net is None:
                return False
            users = sorted(SimNIC.objects.filter(network=net).values_list("vm__key", flat=True))
            if users:
                users = ", ".join(users)
                raise Conflict(f"network {key} on {self.host_name} is still used by {users}: destroy them first")
            net.delete()
        return True

    def list_networks(self):
        self._step("list_networks")
        return [NetworkInfo(net.key, net.cidr) for net in SimNetwork.objects.filter(host=self.host())]

    def private_addresses(self, key):
        """``{network key: address}`` of the VM's private NICs (what its guest would get by DHCP)."""
        return dict(self._vm(key).nics.values_list("network__key", "address"))

    def console_address(self, key):
        raise base.NoConsole(f"{key} is a simulated VM: it has no screen, so there is no console to show")

    def serial_console(self, key):
        raise base.NoConsole(f"{key} is a simulated VM: it has no serial port, so there is no console to show")

    def address(self, key):
        vm = self._quiet_vm(key, "address")
        if vm is None:
            self._step("address")
            vm = self._vm(key)
        return vm.address if vm.state == SimVM.State.RUNNING else None

    def guest_sessions(self, key):
        """The sessions set by ``services.set_sessions`` (none by default: nobody connects)."""
        self._step("guest_sessions")
        vm = self._vm(key)
        if vm.state != SimVM.State.RUNNING:
            raise Conflict(f"{key} is {vm.state}: nobody can be logged in")
        return [
            base.GuestSession(s.get("user", "?"), s.get("login_time"), s.get("idle_seconds")) for s in vm.sessions or []
        ]

    def personalise(self, key, guest):
        """The emulated guest's identity made anew (``SimVM.guest["identity"]``: a host key
        fingerprint, a machine-id, the hostname) and the login's seed kept as ``reseed`` keeps it."""
        base.check_key(key)
        self._step("personalise")
        wanted = _seed(key, guest)
        with transaction.atomic():
            vm = self._vm(key, lock=True)
            if vm.state != SimVM.State.RUNNING:
                raise Conflict(f"{key} is {vm.state}: only a running guest takes a login")
            fresh = {"host_key": secrets.token_hex(16), "machine_id": secrets.token_hex(16)}
            identity = {**fresh, "hostname": guest.hostname}
            vm.seed, vm.guest = wanted, {**vm.guest, "identity": identity}
            vm.save(update_fields=["seed", "guest", "updated"])

    def state(self, key):
        base.check_key(key)
        self._step("state")
        vm = SimVM.objects.filter(key=key, host=self.host()).first()
        return VMState(vm.state) if vm else VMState.ABSENT

    # --- the guest command channel (emulated: sim/guest.py) ----------------------------------

    def guest_exec(self, key, tag, argv, env=None, workdir="/"):
        self._step("guest_exec")
        guest.exec_(self, key, tag, list(argv), dict(env or {}), workdir)

    def guest_exec_status(self, key, tag, offset=0, limit=1 << 20):
        self._step("guest_exec_status")
        return guest.status(self, key, tag, offset, limit)

    def guest_put_file(self, key, path, data):
        self._step("guest_put_file")
        guest.put_file(self, key, path, bytes(data))

    def guest_get_file(self, key, path, limit):
        self._step("guest_get_file")
        return guest.get_file(self, key, path, limit)

    def guest_glob(self, key, directory, patterns):
        self._step("guest_glob")
        return guest.glob(self, key, directory, list(patterns))


class _NotQuiet(Exception):
    """``_swap`` could not write: ``_changed`` goes the usual way."""


def _seed(key, guest):
    """What the simulator keeps of a seed: its instance id and digest (the login stays out of the database)."""
    if guest is None:
        return {}
    try:
        return {"instance_id": guest.instance_id, "digest": cloudinit.seed_digest(cloudinit.seed_files(guest))}
    except cloudinit.SeedError as exc:
        raise Invalid(f"{key}: {exc}") from None


def _join(vm, host, nics):
    """The VM's NICs on private networks of ``host`` (NotFound for a network it lacks), each
    with its address: the member's fixed one by MAC, else the lowest free one after them."""
    for key, mac in nics:
        net = SimNetwork.objects.select_for_update().filter(host=host, key=key).first()
        if net is None:
            raise NotFound(f"{vm.key}: no private network {key} on {host.name}; create it first")
        spec = NetworkSpec(net.key, net.cidr, tuple(tuple(pair) for pair in net.hosts))
        address = next((ip for _name, fixed, ip in spec.addresses() if fixed == mac), None)
        if address is None:
            address = _free_address(
                spec, set(SimNIC.objects.filter(network__in=_segment(net)).values_list("address", flat=True))
            )
            if address is None:
                raise Conflict(f"{vm.key}: private network {key} on {host.name} has no free address left")
        SimNIC.objects.create(vm=vm, network=net, mac=mac, address=address)


def _segment(net):
    """The rows of one L2 network: ``net``, and on an overlay its rows on the other hosts of
    that segment (one address space across them)."""
    if not net.overlay:
        return [net]
    return list(SimNetwork.objects.filter(overlay=net.overlay, segment=net.segment, key=net.key))


def _free_address(spec, taken):
    """The lowest address of the network's dynamic range not in ``taken``, or None."""
    dynamic = spec.dynamic_range()
    if dynamic is None:
        return None
    start, end = (ipaddress.IPv4Address(ip) for ip in dynamic)
    return next((str(ip) for ip in spec.network.hosts() if start <= ip <= end and str(ip) not in taken), None)


def _own_savepoint():
    """A savepoint only inside a caller's transaction (which must survive a failed statement)."""
    return transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()


def _leasing(change, attempts=5):
    """``change()`` in a transaction, tried again while an address it leased (``_save``) was
    taken meanwhile: addresses are unique across hosts, and another worker may lease the same
    one between our read and our write. The whole change is tried again, so it needs no
    savepoint of its own."""
    for _ in range(attempts):
        try:
            with transaction.atomic():
                return change()
        except IntegrityError:
            continue
    raise DriverError(f"could not lease an address: taken by another VM {attempts} times in a row", permanent=False)


def _save(vm, host, fields):
    """Save ``fields`` of ``vm`` (in ``_leasing``); a running VM with no address leases the
    lowest free one of the host's pool in the same UPDATE."""
    _lease(vm, host)
    vm.save(update_fields=fields)


def _taken():
    """Every leased address (unique across hosts) as one JSON array: read with the VM that a
    power-on may lease one for, rather than after it."""
    table = connection.ops.quote_name(SimVM._meta.db_table)
    found = "json_group_array(address)" if connection.vendor == "sqlite" else "coalesce(json_agg(address), '[]')::text"
    return RawSQL(f"SELECT {found} FROM {table} WHERE address IS NOT NULL", (), output_field=TextField())


def _lease(vm, host):
    """A running VM with no address is given the lowest free one of the host's pool (the
    addresses taken as read with the VM, ``_taken``, else read now)."""
    if vm.state == SimVM.State.RUNNING and vm.address is None:
        pool = ipaddress.IPv4Network(host.dhcp_pool)
        if hasattr(vm, "taken"):
            taken = set(json.loads(vm.taken))
        else:
            taken = set(SimVM.objects.filter(address__isnull=False).order_by().values_list("address", flat=True))
        vm.address = next((str(ip) for i, ip in enumerate(pool.hosts()) if i > 0 and str(ip) not in taken), None)
        if vm.address is None:
            raise Conflict(f"DHCP pool {pool} of {host.name} is exhausted")


_SWAPPED = ("state", "address", "sessions", "guest")  # what a power change reads and may write


def _swap(read, vm, host, fields):
    """``_save`` without a transaction: the fields whose value changed from ``read`` (the row
    as read) by one UPDATE conditional on the row still holding those values and its state (a
    compare-and-set: no lock held, none needed). ``_NotQuiet`` when it cannot: a JSON field
    changed (compared as text, equal values may differ), the row changed since it was read, or
    the address leased was taken by another VM meanwhile (the unique address)."""
    _lease(vm, host)
    written = {name: getattr(vm, name) for name in fields if name in read and getattr(vm, name) != read[name]}
    if any(SimVM._meta.get_field(name).get_internal_type() == "JSONField" for name in written):
        raise _NotQuiet
    rows = SimVM.objects.filter(pk=vm.pk, **{name: read[name] for name in ("state", *written)})
    try:
        # Only a leased address can break a constraint: a caller's transaction must survive that.
        with _own_savepoint() if "address" in written else contextlib.nullcontext():
            vm.updated = timezone.now()
            changed = rows.update(updated=vm.updated, **written)
    except IntegrityError:
        raise _NotQuiet from None
    if not changed:
        raise _NotQuiet
