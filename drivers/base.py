"""The hypervisor driver interface: plain data in, plain data out, no Django models.

Contract (every driver, tested by ``tests/drivers/test_contract.py``):

- A driver instance talks to ONE host (``facts()`` describes it); ``discover()`` lists every
  host its connection can see (a vCenter sees many).
- A VM is named by its key, ``vm_key(vm_id)`` → ``vcl-<id>``. Every call is idempotent by key:
  a retried ``create`` returns the VM the first attempt made and never makes a second one;
  ``start`` on a running VM, ``stop`` on a stopped one, ``snapshot`` with a name that exists and
  ``destroy`` of an absent VM all succeed without doing anything.
- ``create`` stores a fingerprint of the spec on the VM. A VM with the same key but another
  fingerprint (someone else's VM with that name) is a ``Conflict``, never silently adopted.
- ``create`` needs the image staged on the host first (``stage_image``); it does not transfer
  images itself, so transfers stay under the image cache's throttle.
- ``capture`` needs a stopped VM. ``stop(force=False)`` asks the guest; ``force=True`` pulls the
  plug (and discards a suspended VM's saved state). After ``revert`` the VM is in the state it
  had when the snapshot was taken (or stopped, where the driver cannot restore memory).
- ``reseed(key, guest)`` replaces the first-boot configuration of a stopped VM (``guest``: a
  ``cloudinit.GuestLogin``; None removes it), for a VM reverted to a clean snapshot and handed
  to its next user. A different seed must bring a new ``instance_id`` (the guest applies a
  seed once per instance id), else ``Invalid``; the seed it already has is left alone; a VM
  that is not stopped is a ``Conflict``.
- ``resize(key, vcpus, memory_mib)`` changes the VM's persistent definition and answers when
  that takes effect: ``APPLIES_NOW`` (a stopped VM, or a driver that applied it to the running
  guest) or ``APPLIES_NEXT_BOOT`` (a running or suspended VM gets it when it next boots).
  Idempotent; a VM the hypervisor cannot change in its state is a ``Conflict``; the disk keeps its size.
- Errors are ``DriverError``s that say whether retrying the same call can help
  (``permanent=False``: transport trouble, a busy host) or not (``permanent=True``: invalid
  request, missing object, wrong state).
- The guest command channel (batch runs): ``guest_exec(key, tag, argv, env, workdir)`` starts a
  command in the running guest and returns at once; it is idempotent by ``tag`` (a second call
  with the same tag starts nothing), so a retried step never runs a command twice.
  ``guest_exec_status(key, tag, offset)`` returns an ``ExecStatus``: whether it ended, its
  exit status, and the output (stdout and stderr together, as bytes) from ``offset`` on, so
  output is read as it is produced and a reader that lost its place asks again. Killing it is
  destroying the VM (the caller's time limit). ``guest_put_file`` / ``guest_get_file`` move
  a file in and out (``guest_get_file`` refuses a file over ``limit`` bytes), ``guest_glob``
  lists the regular files under a directory that match shell patterns. Paths are absolute
  paths in the guest; the caller keeps them inside its work directory.
- ``personalise(key, guest)`` hands a running guest booted with no seed (a warm VM) to its
  first user: a new identity (hostname ``guest.hostname``, machine-id, SSH host keys, the login
  service restarted with them) and ``guest``'s login (its account, password hash and SSH keys).
  Idempotent (the same call again gives the same login; the identity is made anew). A temporary
  error when the guest's agent does not answer, ``Conflict`` when the VM is not running,
  ``Invalid`` where the driver cannot (the caller builds the VM cold instead).
- ``guest_sessions(key)`` lists who is logged in to the running guest (``GuestSession``: user,
  login time, seconds since the last input where the guest reports it, else None); ``Invalid``
  where the hypervisor cannot tell (the caller then applies no idle policy), a temporary error
  when the guest's agent does not answer, ``Conflict`` when the VM is not running.
- Private networks (environments: several VMs that reach one another and nothing else):
  ``create_network(NetworkSpec)`` makes an isolated L2 network on this host, idempotent by
  key (the same spec again returns it; another spec under that key is a ``Conflict``);
  ``delete_network(key)`` removes it (False when absent; a ``Conflict`` while a VM of this
  host still uses it, where the driver can tell); ``list_networks()`` lists vclmgr's own.
  A ``VMSpec``'s ``private_networks`` are NICs after the primary one, each on a network that
  must exist on the VM's host (members of one network share a host, unless the hosts share
  an overlay: then the network is made on each of them, ``NetworkSpec.overlay``), each on
  the MAC the host's driver gives (``driver.private_mac(vm key, network key)``: VMware
  takes static MACs only in its own range). A driver without private networks leaves
  ``supports_networks`` False.
- Every contract call is fenced (``core.fencing``): made by a job that lost its lease, it
  raises ``LeaseLost`` before it starts, and after it returns (the step goes no further).
"""

import contextlib
import enum
import functools
import hashlib
import ipaddress
import json
import os
import re
import tempfile
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from core import fencing, outbound
from drivers.cloudinit import GuestLogin

# The errors are part of the contract: drivers and callers take them from here too.
from drivers.errors import Conflict, DriverError, Invalid, NoConsole, NotFound, Unauthorized, Unreachable  # noqa: F401

VM_KEY_PREFIX = "vcl-"
# Safe as a libvirt domain name, a vSphere VM name, a file name and a DNS label.
VM_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
# Image names become volume and datastore file names: no slashes, no spaces.
IMAGE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
FORMATS = ("qcow2", "raw", "vmdk", "template", "sim")


APPLIES_NOW = "now"
APPLIES_NEXT_BOOT = "next boot"


def vm_key(vm_id):
    """The stable hypervisor-side name of the VM with this database id."""
    return f"{VM_KEY_PREFIX}{int(vm_id)}"


class VMState(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    SUSPENDED = "suspended"
    ERROR = "error"
    ABSENT = "absent"


# --- plain data -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageVariantSpec:
    """One hypervisor-specific form of an image.

    ``location``: a local path, ``file://`` or ``http(s)://`` URL of a qcow2/raw/vmdk file, a
    path already on the host's storage, or the name of a vSphere template. ``checksum``:
    ``sha256:<hex>`` (or another hashlib algorithm), bare 64-hex sha256, or "" (not verified).

    Direct kernel boot (Ganeti's ``kernel_path``/``initrd_path``/``kernel_args``, OpenStack's
    ``kernel_id``/``ramdisk_id``/``os_command_line``): ``kernel`` and ``initrd`` are located
    like ``location`` and staged with the disk; the VM then boots that kernel with
    ``kernel_args`` instead of the disk's boot loader. The initrd is optional (a kernel may
    carry its own initramfs, or mount the root disk itself). A checksummed disk needs its
    kernel and initrd checksummed too (``kernel_checksum``, ``initrd_checksum``): a verified
    image stays verified as a whole.
    """

    name: str
    format: str
    location: str
    checksum: str = ""
    size_gib: int = 0
    kernel: str = ""
    initrd: str = ""
    kernel_args: str = ""
    kernel_checksum: str = ""
    initrd_checksum: str = ""

    def validate(self):
        if not IMAGE_NAME_RE.match(self.name or ""):
            raise Invalid(f"image name {self.name!r}: use letters, digits, '.', '_' and '-' (at most 100)")
        if self.format not in FORMATS:
            raise Invalid(f"image {self.name}: unknown format {self.format!r} (one of {', '.join(FORMATS)})")
        if not self.location:
            raise Invalid(f"image {self.name}: no location")
        if self.checksum:
            parse_checksum(self.checksum)
        if not isinstance(self.size_gib, int) or self.size_gib < 0:
            raise Invalid(f"image {self.name}: size_gib must be a whole number ≥ 0")
        self._validate_kernel()

    def _validate_kernel(self):
        if not self.kernel:
            extra = [n for n in ("initrd", "kernel_args", "kernel_checksum", "initrd_checksum") if getattr(self, n)]
            if extra:
                raise Invalid(f"image {self.name}: {', '.join(extra)} without a kernel")
            return
        if self.initrd_checksum and not self.initrd:
            raise Invalid(f"image {self.name}: initrd_checksum without an initrd")
        for what in ("kernel", "initrd"):
            location = getattr(self, what)
            if location and not location.startswith(("/", "file://", "http://", "https://")):
                raise Invalid(f"image {self.name}: {what} {location!r} is not a path, file:// or http(s):// URL")
            checksum = getattr(self, f"{what}_checksum")
            if checksum:
                parse_checksum(checksum)
            elif location and self.checksum:
                raise Invalid(f"image {self.name}: the disk has a checksum, so the {what} needs one ({what}_checksum)")
        check_kernel_args(self.kernel_args, self.name)

    def boot_files(self):
        """``(role, spec)`` of the files a direct kernel boot needs (none without a kernel):
        each as an ImageVariantSpec, so that it is fetched, verified and named like a disk."""
        files = [("kernel", self.kernel, self.kernel_checksum), ("initrd", self.initrd, self.initrd_checksum)]
        return [
            (role, ImageVariantSpec(name=self.name, format="raw", location=where, checksum=checksum))
            for role, where, checksum in files
            if where
        ]

    def as_dict(self):
        return asdict(self)


KERNEL_ARGS_MAX = 1024


def check_kernel_args(args, name="?"):
    """A kernel command line: printable text on one line, at most ``KERNEL_ARGS_MAX`` characters."""
    if not isinstance(args, str) or len(args) > KERNEL_ARGS_MAX or not args.isprintable():
        raise Invalid(
            f"image {name}: kernel_args must be printable text on one line, at most {KERNEL_ARGS_MAX} characters"
        )
    return args


@dataclass(frozen=True)
class VMSpec:
    """What to create. ``network``: a libvirt network (or ``bridge:<name>``), a vSphere port
    group, or a sim DHCP pool name. ``extra``: driver-specific knobs, e.g.
    ``{"vmware.extra_config": {...}, "vmware.guest_id": "ubuntu64Guest"}``; ``guest_port``:
    the port of the guest's login service (22, or 3389 for RDP), which a driver that
    forwards ports forwards."""

    key: str
    vcpus: int
    memory_mib: int
    disk_gib: int
    image: ImageVariantSpec
    network: str = "default"
    extra: Mapping = field(default_factory=dict)
    # What the guest is told at first boot (user, password hash, keys, hostname): a NoCloud seed
    # on libvirt, guestinfo on VMware. None: the image's own defaults (sim, or a test).
    guest: GuestLogin | None = None
    # NICs after the primary one: (network key, MAC) pairs, each on a private network of the
    # VM's host (``NetworkSpec``); ``private_mac`` gives the MAC a member is known by.
    private_networks: tuple[tuple[str, str], ...] = ()
    # GPUs passed through, model → count (the models of the host's ``HostFacts.devices``): the
    # claim's ``gpu:<model>`` resources. A driver that cannot pass devices through ignores it.
    gpus: Mapping = field(default_factory=dict)

    def validate(self):
        if not isinstance(self.key, str) or not VM_KEY_RE.match(self.key):
            raise Invalid(f"VM key {self.key!r}: 1–63 letters, digits and '-', starting with a letter or digit")
        _check_private_nics(self.key, self.private_networks)
        for name, low in (("vcpus", 1), ("memory_mib", 16), ("disk_gib", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise Invalid(f"{self.key} {name}: must be a whole number ≥ {low}, not {value!r}")
        if not self.network or any(ch.isspace() or ch in "<>&'\"" for ch in self.network):
            raise Invalid(f"{self.key} network: {self.network!r} is not a network name")
        for model, count in self.gpus.items():
            if not isinstance(model, str) or not IMAGE_NAME_RE.match(model):
                raise Invalid(f"{self.key} GPU model {model!r}: letters, digits, '.', '_' and '-'")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise Invalid(f"{self.key} GPUs of {model}: a whole number ≥ 1, not {count!r}")
        self.image.validate()

    def fingerprint(self):
        """Identifies the request that made a VM: a retried create matches, a stranger does not."""
        body = {
            "key": self.key,
            "size": [self.vcpus, self.memory_mib, self.disk_gib],
            "image": [self.image.name, self.image.location, self.image.checksum],
        }
        if self.image.kernel:  # absent otherwise: a disk-booted VM's fingerprint stays as it was
            body["kernel"] = [self.image.kernel, self.image.initrd, self.image.kernel_args]
        if self.private_networks:  # absent otherwise: the fingerprint of every older VM stays
            body["private_networks"] = [list(pair) for pair in self.private_networks]
        if self.gpus:  # absent without GPUs: VMs made before GPUs keep their fingerprint
            body["gpus"] = dict(sorted(self.gpus.items()))
        raw = json.dumps(body, sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:24]


NETWORK_PREFIXES = (16, 29)  # a private network's prefix length, both ends included
_PRIVATE_RANGES = tuple(ipaddress.IPv4Network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


MAX_SEGMENT = 4094  # the highest VLAN tag


@dataclass(frozen=True)
class NetworkSpec:
    """An isolated L2 network of one host: no route out, DHCP and DNS for its members only.

    ``key``: vclmgr's name for it (the rules of VM keys, e.g. ``env12-lan``). ``cidr``: an
    RFC 1918 range, /16 to /29, whose first address is the gateway (the host's side: DHCP and
    DNS server, routing nowhere). ``hosts``: ``(hostname, mac)`` pairs, given fixed addresses
    in order after the gateway and resolvable by hostname from the other members; the rest of
    the range is leased to any other NIC.

    ``overlay``, ``segment``: a network spread over hosts of one overlay (the operator's
    network between them) is this network on each of those hosts, joined on that segment of
    the overlay (a VLAN tag, 1–4094); only its ``home`` host (its first member's) serves DHCP
    and DNS and has the gateway address, which the others' members reach over the overlay.
    """

    key: str
    cidr: str
    hosts: tuple[tuple[str, str], ...] = ()
    overlay: str = ""
    segment: int = 0
    home: bool = True

    def validate(self):
        if not isinstance(self.key, str) or not VM_KEY_RE.match(self.key):
            raise Invalid(f"network key {self.key!r}: 1–63 letters, digits and '-', starting with a letter or digit")
        try:
            net = ipaddress.IPv4Network(self.cidr)
        except (ValueError, TypeError) as exc:
            raise Invalid(f"network {self.key} cidr {self.cidr!r}: not an IPv4 network ({exc})") from None
        if not any(net.subnet_of(private) for private in _PRIVATE_RANGES):
            raise Invalid(f"network {self.key} cidr {self.cidr}: not a private range (10/8, 172.16/12, 192.168/16)")
        low, high = NETWORK_PREFIXES
        if not low <= net.prefixlen <= high:
            raise Invalid(f"network {self.key} cidr {self.cidr}: the prefix must be /{low} to /{high}")
        if not isinstance(self.hosts, tuple):
            raise Invalid(f"network {self.key} hosts: a tuple of (hostname, mac) pairs")
        for pair in self.hosts:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise Invalid(f"network {self.key} hosts: {pair!r} is not a (hostname, mac) pair")
            if not isinstance(pair[0], str) or not HOSTNAME_RE.match(pair[0]):
                raise Invalid(f"network {self.key} host {pair[0]!r}: a DNS label (lower-case letters, digits, '-')")
            check_mac(pair[1], f"network {self.key} host {pair[0]}")
        for what, values in (("hostname", [h for h, _ in self.hosts]), ("MAC", [m for _, m in self.hosts])):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise Invalid(f"network {self.key}: {what} {', '.join(twice)} given twice")
        if len(self.hosts) > net.num_addresses - 3:  # the network's, the gateway's, the broadcast address
            raise Invalid(f"network {self.key}: {len(self.hosts)} hosts do not fit in {self.cidr}")
        if bool(self.overlay) != bool(self.segment) or not 0 <= self.segment <= MAX_SEGMENT:
            raise Invalid(f"network {self.key}: an overlay needs a segment 1–{MAX_SEGMENT}, and a segment an overlay")
        if not self.home and not self.overlay:
            raise Invalid(f"network {self.key}: only a network on an overlay has another home host")

    @property
    def network(self):
        return ipaddress.IPv4Network(self.cidr)

    @property
    def gateway(self):
        """The host's address on it: DHCP and DNS server, and no gateway to anywhere."""
        return str(self.network.network_address + 1)

    def addresses(self):
        """``[(hostname, mac, address)]`` of the members, in order after the gateway."""
        first = self.network.network_address + 2
        return [(name, mac, str(first + i)) for i, (name, mac) in enumerate(self.hosts)]

    def dynamic_range(self):
        """``(start, end)`` of the addresses left for other NICs, or None when none are."""
        start = self.network.network_address + 2 + len(self.hosts)
        end = self.network.broadcast_address - 1
        return (str(start), str(end)) if start <= end else None

    def fingerprint(self):
        body = [self.key, str(self.network), [list(h) for h in self.hosts]]
        if self.overlay:  # absent otherwise: the fingerprint of every older network stays
            body.append([self.overlay, self.segment, self.home])
        return hashlib.sha256(json.dumps(body).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class NetworkInfo:
    key: str
    cidr: str
    managed: bool = True


def private_mac(vm_key, network_key):
    """The MAC of VM ``vm_key``'s NIC on private network ``network_key``: stable, so the
    network's fixed addresses and names follow it. Locally administered unicast (``02:``),
    under no vendor's prefix, so it collides with no MAC a hypervisor hands out itself."""
    digest = hashlib.sha256(f"{vm_key}/{network_key}".encode()).digest()
    return "02:" + ":".join(f"{byte:02x}" for byte in digest[:5])


def check_mac(mac, what):
    """A lower-case unicast MAC, or Invalid naming ``what``."""
    if not isinstance(mac, str) or not MAC_RE.match(mac):
        raise Invalid(f"{what} MAC {mac!r}: six lower-case hex pairs separated by ':'")
    if int(mac[:2], 16) & 1:
        raise Invalid(f"{what} MAC {mac}: a multicast address")
    return mac


def _check_private_nics(key, nics):
    if not isinstance(nics, tuple):
        raise Invalid(f"{key} private_networks: a tuple of (network key, mac) pairs")
    for pair in nics:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise Invalid(f"{key} private_networks: {pair!r} is not a (network key, mac) pair")
        if not isinstance(pair[0], str) or not VM_KEY_RE.match(pair[0]):
            raise Invalid(f"{key} private network {pair[0]!r}: not a network key")
        check_mac(pair[1], f"{key} private network {pair[0]}")
    for what, values in (("network", [n for n, _ in nics]), ("MAC", [m for _, m in nics])):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise Invalid(f"{key} private_networks: {what} {', '.join(twice)} given twice")


@dataclass(frozen=True)
class HostFacts:
    """Capacity and load of one host as the hypervisor reports it (None: not known)."""

    name: str
    hypervisor_type: str
    version: str
    cpus: int
    memory_mib: int
    disk_gib: int
    free_memory_mib: int | None = None
    free_disk_gib: int | None = None
    vms: int = 0
    running_vms: int = 0
    extra: Mapping = field(default_factory=dict)
    # GPUs and vGPU types, as ``inventory/devices.py`` describes them; None: this driver cannot tell.
    devices: list | None = None

    def as_dict(self):
        return asdict(self)


@dataclass(frozen=True)
class VMInfo:
    key: str
    state: VMState
    host: str
    vcpus: int = 0
    memory_mib: int = 0
    managed: bool = True  # created by vclmgr (named vcl-…) rather than found on the host


@dataclass(frozen=True)
class ExecStatus:
    """A guest command's progress: ``output`` is what it printed from the asked offset on."""

    exited: bool
    exit_status: int | None = None
    output: bytes = b""


@dataclass(frozen=True)
class GuestSession:
    """One login inside a guest. ``login_time``: seconds since the epoch (None: not told);
    ``idle_seconds``: since the session's last input (None: the guest does not say; an open
    session then counts as active)."""

    user: str
    login_time: float | None = None
    idle_seconds: float | None = None

    def as_dict(self):
        return asdict(self)


# --- the interface --------------------------------------------------------------------------


# The calls fenced by a job's lease (``Driver.__init_subclass__`` wraps each where it is defined).
FENCED_CALLS = (
    "facts", "discover", "list_vms", "stage_image", "create", "start", "stop", "suspend", "resume",
    "destroy", "snapshot", "revert", "reseed", "resize", "capture", "migrate", "address", "port", "state",
    "agent_answers", "guest_exec", "guest_exec_status", "guest_put_file", "guest_get_file", "guest_glob",
    "guest_sessions", "create_network", "delete_network", "list_networks", "personalise",
)  # fmt: skip


def _fenced(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        fencing.check()
        result = method(self, *args, **kwargs)
        fencing.check()
        return result

    call.fenced = True
    return call


def _fence_calls(cls):
    for name in FENCED_CALLS:
        method = cls.__dict__.get(name)
        if callable(method) and not getattr(method, "fenced", False):
            setattr(cls, name, _fenced(method))


class Driver:
    """Base class; see the module docstring for the contract every method keeps."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _fence_calls(cls)

    kind = ""  # its name in drivers/registry.py, which says what the kind runs
    # Its VMs run a real guest OS: a VM is ready only once its login service answers (the
    # simulators' VMs are ready when they have an address).
    boots_guests = False
    # ``migrate`` moves a suspended VM with its saved memory, so a suspended run may resume on
    # another host (sim, VMware, libvirt but not from shared storage).
    moves_suspended = False
    # It makes private networks (``create_network`` and ``VMSpec.private_networks``).
    supports_networks = False

    @property
    def hypervisor_type(self):
        from drivers import registry

        return registry.kind(self.kind).hypervisor_type

    @property
    def boots_kernel(self):
        """It boots a variant's own kernel (``ImageVariantSpec.kernel``) instead of the disk."""
        from drivers import registry

        return registry.kind(self.kind).boots_kernel

    @property
    def formats(self):
        """Image formats the hypervisor runs; None: any (the simulator emulates them)."""
        from drivers import registry

        return registry.kind(self.kind).image_formats

    def __init__(self, uri, credentials=None, options=None):
        self.uri = uri
        self.credentials = dict(credentials or {})
        self.options = dict(options or {})

    def __repr__(self):
        return f"<{type(self).__name__} {self.uri}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Release connections (drivers may keep them pooled per process)."""

    # host
    def facts(self) -> HostFacts:
        raise NotImplementedError

    def discover(self) -> list[HostFacts]:
        """Every host this connection can see; a single-host driver sees itself."""
        return [self.facts()]

    def list_vms(self) -> list[VMInfo]:
        raise NotImplementedError

    # images
    def stage_image(self, image: ImageVariantSpec) -> str:
        raise NotImplementedError

    def unstage_image(self, location) -> bool:
        """Remove the copy of an image that ``stage_image`` made and answered ``location`` for;
        False when it is not there (any more). Never the library's own source (a template, a
        disk that was on the host's storage already): callers pass only copies."""
        raise NotImplementedError

    # lifecycle
    def create(self, spec: VMSpec) -> VMInfo:
        raise NotImplementedError

    def start(self, key):
        raise NotImplementedError

    def stop(self, key, force=False):
        raise NotImplementedError

    def suspend(self, key):
        raise NotImplementedError

    def resume(self, key):
        raise NotImplementedError

    def destroy(self, key):
        raise NotImplementedError

    def snapshot(self, key, name):
        raise NotImplementedError

    def revert(self, key, name):
        raise NotImplementedError

    def reseed(self, key, guest: GuestLogin | None):
        """Give the stopped VM ``key`` the seed of ``guest`` (None: no seed); see the module docstring."""
        raise NotImplementedError

    def resize(self, key, vcpus, memory_mib) -> str:
        """Give the VM ``key`` these vCPUs and memory; see the module docstring."""
        raise Invalid(f"{self.kind} hosts cannot change a VM's size")

    def capture(self, key, new_image_name) -> ImageVariantSpec:
        raise NotImplementedError

    def migrate(self, key, target: "Driver") -> dict | None:
        """Move the VM ``key`` to ``target``'s host (live when it runs, where the driver can).
        → figures of the move the hypervisor measured (``downtime_ms``, ``total_ms``, …), or None."""
        raise NotImplementedError

    def address(self, key) -> str | None:
        raise NotImplementedError

    def port(self, key, guest_port):
        """Where the guest's ``guest_port`` is reached at ``address(key)``: itself, unless the
        driver forwards it (libvirt's user-mode network: a port on the host's 127.0.0.1)."""
        return guest_port

    def state(self, key) -> VMState:
        raise NotImplementedError

    def console_address(self, key) -> tuple[str, int]:
        """Where the running VM's VNC server is reached from vclmgr: ``(host, port)``, plain RFB
        (the web console's websocket proxy connects there). ``NoConsole`` when it has none."""
        raise NoConsole(f"{self.kind} hosts give no graphical console")

    def serial_console(self, key):
        """An open byte stream to the running VM's first serial port: an object with blocking
        ``read() -> bytes`` (b"" at its end), ``write(data)`` and ``close()`` (which ends a
        ``read`` waiting in another thread). ``NoConsole`` when it has none."""
        raise NoConsole(f"{self.kind} hosts give no serial console")

    def agent_answers(self, key) -> bool:
        """True when the VM's guest agent answers a ping (readiness by agent, not by port)."""
        raise Invalid(f"{self.kind} hosts cannot reach a guest agent: use readiness by port")

    # the guest command channel (see the module docstring)
    def guest_exec(self, key, tag, argv, env=None, workdir="/") -> None:
        raise Invalid(f"{self.kind} hosts have no guest command channel")

    def guest_exec_status(self, key, tag, offset=0, limit=1 << 20) -> ExecStatus:
        raise Invalid(f"{self.kind} hosts have no guest command channel")

    def guest_put_file(self, key, path, data: bytes):
        raise Invalid(f"{self.kind} hosts have no guest command channel")

    def guest_get_file(self, key, path, limit) -> bytes:
        raise Invalid(f"{self.kind} hosts have no guest command channel")

    def guest_glob(self, key, directory, patterns) -> list[str]:
        raise Invalid(f"{self.kind} hosts have no guest command channel")

    def personalise(self, key, guest: GuestLogin):
        """Give a running guest booted with no seed its user (see the module docstring)."""
        raise Invalid(f"{self.kind} hosts cannot hand a login to a running guest")

    def guest_sessions(self, key) -> list[GuestSession]:
        """Who is logged in to the guest now (see the module docstring)."""
        raise Invalid(f"{self.kind} hosts do not report the guest's logins")

    # private networks (see the module docstring)
    def create_network(self, spec: NetworkSpec) -> NetworkInfo:
        raise Invalid(f"{self.kind} hosts make no private networks")

    def delete_network(self, key) -> bool:
        raise Invalid(f"{self.kind} hosts make no private networks")

    def list_networks(self) -> list[NetworkInfo]:
        raise Invalid(f"{self.kind} hosts make no private networks")

    def private_mac(self, vm_key, network_key) -> str:
        """The MAC to give VM ``vm_key``'s NIC on ``network_key`` (``VMSpec.private_networks``):
        ``private_mac``'s, unless the hypervisor takes static MACs only in a range of its own."""
        return private_mac(vm_key, network_key)

    # helpers shared by drivers
    def check_image(self, image):
        """Validate ``image`` and refuse a format this hypervisor cannot run (images are not portable)."""
        image.validate()
        if self.formats is not None and image.format not in self.formats:
            raise Invalid(
                f"image {image.name}: {self.kind} hosts run {' or '.join(self.formats)} images, not {image.format}"
            )
        if image.kernel and not self.boots_kernel:
            raise Invalid(f"image {image.name}: {self.kind} hosts cannot boot a kernel directly; boot the disk instead")

    def _same_kind(self, target):
        if type(target) is not type(self):
            raise Invalid(f"cannot migrate from a {self.kind} host to a {getattr(target, 'kind', target)!r} host")


_fence_calls(Driver)  # the base's own defaults (discover, port) too


# The power state machine every driver keeps: action → (state it reaches, states it acts on).
# A stop with force also acts on a suspended VM (its saved memory is discarded).
POWER_ACTIONS = {
    "start": (VMState.RUNNING, {VMState.STOPPED, VMState.SUSPENDED}),
    "stop": (VMState.STOPPED, {VMState.RUNNING, VMState.ERROR}),
    "suspend": (VMState.SUSPENDED, {VMState.RUNNING}),
    "resume": (VMState.RUNNING, {VMState.SUSPENDED}),
}


def needs(action, key, state, force=False):
    """True when ``action`` has work to do on a VM in ``state``; False when it is done already.

    Raises Conflict when the action cannot start from that state (suspend a stopped VM).
    """
    target, acts_on = POWER_ACTIONS[action]
    if state == target:
        return False
    if state in acts_on or (action == "stop" and force and state == VMState.SUSPENDED):
        return True
    if action == "stop" and state == VMState.SUSPENDED:
        raise Conflict(f"{key} is suspended: resume it first, or stop it with force to discard its memory")
    raise Conflict(f"cannot {action} {key}: it is {state}")


def wait_until(done, what, timeout, poll=0.5):
    """Poll ``done()`` until true; a temporary error after ``timeout`` seconds."""
    deadline = time.monotonic() + float(timeout)
    while not done():
        if time.monotonic() > deadline:
            raise DriverError(f"{what} did not happen within {float(timeout):g} s", permanent=False)
        time.sleep(poll)


def check_reseed(key, state, old_instance_id, guest, same_seed):
    """The refusals every driver's ``reseed`` shares (see the module docstring)."""
    if state != VMState.STOPPED:
        raise Conflict(f"cannot reseed {key}: it is {state}; the guest reads its seed at boot, so stop it first")
    if guest is not None and old_instance_id == guest.instance_id and not same_seed:
        raise Invalid(
            f"cannot reseed {key}: the new seed keeps instance id {old_instance_id!r}, so the guest would not apply it"
        )


def network_conflict(key, where):
    return Conflict(f"a network named {key} already exists on {where} and was not made by this request")


def check_key(key):
    if not isinstance(key, str) or not VM_KEY_RE.match(key):
        raise Invalid(f"VM key {key!r}: 1–63 letters, digits and '-', starting with a letter or digit")
    return key


EXEC_TAG_RE = re.compile(r"^[a-z0-9-]{1,40}$")


def check_exec(tag, argv, env=None):
    """The channel's own checks (callers validate users' input before; this guards the guest)."""
    if not EXEC_TAG_RE.match(str(tag)):
        raise Invalid(f"bad exec tag {str(tag)[:50]!r}")
    if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise Invalid("a command is a non-empty list of strings without NUL")
    for name in env or {}:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise Invalid(f"bad environment variable name {name[:50]!r}")


def check_size(key, vcpus, memory_mib):
    """Refuse a size no VM may have (as ``VMSpec.validate``)."""
    for name, value, low in (("vcpus", vcpus, 1), ("memory_mib", memory_mib, 16)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise Invalid(f"{key} {name}: must be a whole number ≥ {low}, not {value!r}")


def applies(state):
    """When a new size reaches a VM in ``state`` that only its definition was changed for."""
    return APPLIES_NOW if state == VMState.STOPPED else APPLIES_NEXT_BOOT


def check_snapshot_name(name):
    if not isinstance(name, str) or not IMAGE_NAME_RE.match(name):
        raise Invalid(f"snapshot name {name!r}: use letters, digits, '.', '_' and '-' (at most 100)")
    return name


def check_image_name(name):
    if not isinstance(name, str) or not IMAGE_NAME_RE.match(name):
        raise Invalid(f"image name {name!r}: use letters, digits, '.', '_' and '-' (at most 100)")
    return name


def is_managed(name):
    return name.startswith(VM_KEY_PREFIX) and bool(VM_KEY_RE.match(name))


# --- image transfer helpers -----------------------------------------------------------------


def parse_checksum(checksum):
    """``'sha256:ab…'`` → (``'sha256'``, ``'ab…'``); a bare 64-hex string is sha256."""
    algo, sep, digest = checksum.partition(":")
    if not sep:
        algo, digest = "sha256", checksum
    algo = algo.lower()
    if algo not in hashlib.algorithms_guaranteed or not re.fullmatch(r"[0-9a-fA-F]{8,128}", digest):
        raise Invalid(f"checksum {checksum!r}: expected '<algorithm>:<hex>', e.g. 'sha256:…'")
    return algo, digest.lower()


def local_path(location):
    """The local file a location names, or None (a URL or a name on the hypervisor)."""
    if location.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(location).path)
    if location.startswith("/") and os.path.isfile(location):
        return location
    return None


@contextlib.contextmanager
def fetched(image: ImageVariantSpec):
    """A local, checksum-verified copy of the image's bytes: the file itself, or a download.

    Raises Invalid (permanent) on a checksum mismatch or a missing file, Unreachable
    (temporary) when the download fails.
    """
    path = local_path(image.location)
    if path is not None:
        if not os.path.isfile(path):
            raise NotFound(f"image {image.name}: no file at {path}")
        verify_checksum(image, path)
        yield path
        return
    if not image.location.startswith(("http://", "https://")):
        raise Invalid(f"image {image.name}: cannot fetch {image.location!r} (a local path or http(s) URL)")
    with tempfile.TemporaryDirectory(prefix="vclmgr-fetch-") as tmp:
        target = os.path.join(tmp, "image")
        with open(target, "wb") as out:
            _download(image, out)
        verify_checksum(image, target)
        yield target


def _download(image, out):
    from django.conf import settings

    try:
        outbound.download(
            image.location,
            out,
            timeout=settings.VCLMGR_IMAGE_FETCH_TIMEOUT,
            max_bytes=settings.VCLMGR_IMAGE_FETCH_MAX_GIB << 30,
        )
    except outbound.Refused as exc:
        raise Invalid(
            f"image {image.name}: {image.location} is not allowed: {exc} (VCLMGR_OUTBOUND_ALLOW names exceptions)"
        ) from None
    except outbound.TooLarge as exc:
        raise Invalid(f"image {image.name}: {exc} (VCLMGR_IMAGE_FETCH_MAX_GIB)") from None
    except outbound.Failed as exc:
        error = NotFound if exc.status and 400 <= exc.status < 500 else Unreachable
        raise error(f"image {image.name}: download of {image.location} failed: {exc}") from None


def verify_checksum(image: ImageVariantSpec, path):
    if not image.checksum:
        return
    algo, expected = parse_checksum(image.checksum)
    digest = hashlib.new(algo)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise Invalid(
            f"image {image.name}: checksum mismatch for {image.location} "
            f"(expected {algo}:{expected}, got {algo}:{digest.hexdigest()})"
        )


def staged_name(image: ImageVariantSpec, suffix=""):
    """A name for the image on the host that changes when its content does."""
    tag = (
        parse_checksum(image.checksum)[1][:12]
        if image.checksum
        else hashlib.sha256(image.location.encode()).hexdigest()[:12]
    )
    return f"{image.name}-{tag}{suffix}"
