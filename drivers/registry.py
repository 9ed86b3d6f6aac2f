"""The one table of driver kinds, and everything derived from it.

A kind is what the inventory calls a host's ``driver``: the class that drives it (a dotted
path, imported on first use, so libvirt and pyVmomi are loaded only by a process that
touches such a host), the hypervisor type it runs, the image formats that type accepts, the
URI schemes it understands and the URI it derives from an address. Model choices, the
URI validator, the inventory's messages and ``driver_for`` all read this table: a new driver
is one folder under ``drivers/`` and one entry in ``_TABLE`` (plus the migration
Django generates for the changed model choices).

Which images a host serves is decided here too (``serves``, ``serving_types``): those with a
variant of its hypervisor type, and no other — a simulated host included, unless the simulator
is told to run any image (``runs_any_image``). Placement, the variant picked for a host, image
pre-staging and runs' platforms all ask these.

This module imports no Django models and reads ``settings`` only inside functions
(``options_for``, ``driver_for``, ``uri_errors``, ``runs_any_image``), so settings and models
can import it.
"""

from dataclasses import dataclass

from django.utils.module_loading import import_string

from core.env import driver_options_errors
from drivers.errors import DriverError, Invalid, Unauthorized

__all__ = [
    "KINDS",
    "DriverError",
    "Invalid",
    "Unauthorized",
    "check_binding",
    "driver_class",
    "driver_for",
    "get_driver",
    "options_for",
    "serves",
    "serving_types",
]
SIM = "sim"  # the simulator's hypervisor type


@dataclass(frozen=True)
class Kind:
    name: str  # the value stored in Hypervisor.driver
    label: str
    driver: str  # dotted path of the Driver class
    hypervisor_type: str  # what ImageVariant.hypervisor_type names
    hypervisor_label: str
    # formats its variants may be in, which its driver runs; None: any (the simulator's driver
    # stages any file). Which images its hosts serve is ``serves``: those with a variant of its type.
    image_formats: tuple | None
    schemes: frozenset  # URI schemes it understands (the part before a '+': qemu+ssh → qemu)
    default_uri: str  # from the host's fields when its uri is blank: {name}, {address}
    uri_needs_host: bool = False
    host_options: tuple = ()  # host fields handed to the driver as options
    options_setting: str = ""  # a setting of options that win over the host's own fields
    discoverable: bool = False  # its driver can list the hosts behind one URI (``discover``)
    # URI transports (``qemu+ssh`` → ssh; "" = local) and query parameters it may use; None: any.
    # libvirt's ``ext`` transport and its ``command=``/``socket=``/``keyfile=`` parameters make
    # the worker run a program or open a file named in the inventory, so they are not on the list.
    transports: frozenset | None = None
    uri_params: frozenset | None = None
    # dotted path of ``errors(options, uri) -> {option: message}`` for a host's driver_options
    option_rules: str = ""
    # its driver boots a variant's own kernel and initrd instead of the disk (``ImageVariantSpec.kernel``)
    boots_kernel: bool = False
    # its driver attaches a private network to an overlay between hosts (``NetworkSpec.overlay``)
    overlays: bool = False


_TABLE = (
    Kind(
        name="sim", label="simulated", driver="drivers.sim.driver.SimDriver",
        hypervisor_type="sim", hypervisor_label="simulated", image_formats=None,
        schemes=frozenset({"sim"}), default_uri="sim://{name}",
        host_options=("cpus", "memory_mib", "disk_gib"), options_setting="VCLMGR_SIM_OPTIONS",
        boots_kernel=True, overlays=True,
    ),
    Kind(
        name="libvirt", label="libvirt (KVM/QEMU)", driver="drivers.libvirt.driver.LibvirtDriver",
        hypervisor_type="kvm", hypervisor_label="KVM/QEMU (libvirt)", image_formats=("qcow2", "raw"),
        schemes=frozenset({"qemu", "test", "xen", "lxc", "bhyve", "ch", "vz"}),
        default_uri="qemu+ssh://root@{address}/system", discoverable=True,
        transports=frozenset({"", "ssh", "tls", "tcp"}),
        uri_params=frozenset({"no_verify", "no_tty", "sshauth", "known_hosts_verify", "socket"}),
        option_rules="drivers.libvirt.options.errors", boots_kernel=True, overlays=True,
    ),
    Kind(
        name="vmware", label="VMware ESXi / vCenter", driver="drivers.vmware.driver.VMwareDriver",
        hypervisor_type="vmware", hypervisor_label="VMware", image_formats=("vmdk", "template"),
        schemes=frozenset({"https", "http"}), default_uri="https://{address}/sdk", uri_needs_host=True,
        discoverable=True, overlays=True,
    ),
)  # fmt: skip
KINDS = {kind.name: kind for kind in _TABLE}

DRIVERS = {name: kind.driver for name, kind in KINDS.items()}
DRIVER_CHOICES = [(name, kind.label) for name, kind in KINDS.items()]
HV_TYPES = {name: kind.hypervisor_type for name, kind in KINDS.items()}  # driver → hypervisor type
HV_TYPE_CHOICES = list(dict.fromkeys((kind.hypervisor_type, kind.hypervisor_label) for kind in KINDS.values()))
IMAGE_FORMATS = {kind.hypervisor_type: kind.image_formats for kind in KINDS.values()}  # hypervisor type → formats
KERNEL_BOOT_TYPES = frozenset(kind.hypervisor_type for kind in KINDS.values() if kind.boots_kernel)
SCHEMES = {name: kind.schemes for name, kind in KINDS.items()}
DISCOVERABLE = tuple(name for name, kind in KINDS.items() if kind.discoverable)
OVERLAY_DRIVERS = tuple(name for name, kind in KINDS.items() if kind.overlays)


def names_text(conjunction="or"):
    """``sim, libvirt or vmware``: the kinds, for messages."""
    names = list(KINDS)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {conjunction} {names[-1]}"


def kind(name):
    try:
        return KINDS[name]
    except KeyError:
        raise Invalid(f"unknown driver {name!r} (one of {', '.join(KINDS)})") from None


def driver_class(name):
    return import_string(kind(name).driver)


def get_driver(name, uri, credentials=None, options=None):
    """A driver for one host. ``credentials``: ``{"username", "password"}``; ``options``: per driver."""
    return driver_class(name)(uri, credentials=credentials, options=options)


def runs_any_image(hypervisor_type):
    """Whether hosts of ``hypervisor_type`` run an image that has no variant of their type (with
    its first variant, in type order): only simulated hosts, and only when ``VCLMGR_SIM_OPTIONS``
    says ``"any_image": true`` (for tests and demos that want every image on the simulator). Off
    by default: a simulated VM of a real image would be "ready" without the image ever running."""
    from django.conf import settings

    return hypervisor_type == SIM and settings.VCLMGR_SIM_OPTIONS.get("any_image") is True


def serving_types(variant_types):
    """The hypervisor types whose hosts run an image with variants of ``variant_types`` (None:
    no restriction): those types, and the simulator's too if it ``runs_any_image``."""
    if variant_types is None:
        return None
    types = frozenset(variant_types)
    if types and runs_any_image(SIM):
        types |= {SIM}
    return types


def serves(hypervisor_type, variant_types):
    """Whether a host of ``hypervisor_type`` runs an image with variants of ``variant_types``."""
    return hypervisor_type in serving_types(variant_types)


def default_uri(kind_name, **fields):
    """The URI a host of this kind is reached at when it names none (``fields``: name, address)."""
    spec = KINDS.get(kind_name) or KINDS["sim"]  # an unknown kind (refused by validation) still gets a printable URI
    return spec.default_uri.format(**fields)


def options_for(name):
    """The options every host of kind ``name`` gets (``VCLMGR_DRIVER_OPTIONS[name]``), a copy."""
    from django.conf import settings

    return dict(settings.VCLMGR_DRIVER_OPTIONS.get(name, {}))


def driver_for(host, guest=None):
    """The driver of an inventory host, with its credential and options: its kind's
    (``VCLMGR_DRIVER_OPTIONS``), then the host's own ``driver_options``, then the kind's
    ``options_setting`` (the simulator's test knobs). ``guest``: the login in a VM's guest
    (``ImageVariant.guest_login()``) for a driver whose guest channel needs one (VMware)."""
    from django.conf import settings

    spec = kind(host.driver)
    credentials = None
    if host.credential_id:
        try:
            check_binding(host.credential, host.connection_uri)
        except Unauthorized as exc:
            raise Unauthorized(f"host {host.name}: {exc}") from None
        credentials = {"username": host.credential.username, "password": host.credential.get_secret()}
    if guest:
        credentials = {**(credentials or {}), "guest": dict(guest)}
    own = getattr(host, "driver_options", None) or {}
    if not isinstance(own, dict):
        raise Invalid(f"host {host.name}: driver_options must be a JSON object, not {type(own).__name__}")
    options = {
        **options_for(spec.name),
        **{field: getattr(host, field) for field in spec.host_options},
        **own,
        **(getattr(settings, spec.options_setting) if spec.options_setting else {}),
    }
    return get_driver(spec.name, host.connection_uri, credentials, options)


def check_binding(credential, uri):
    """``Unauthorized`` unless ``credential`` was saved for ``uri``'s origin (its ``endpoints``),
    before any connection: whoever may edit a host's URI cannot point it at their own listener
    and receive the secret. A URI that names no host (the local libvirtd) needs no binding."""
    from urllib.parse import urlsplit

    try:
        names_host = bool(urlsplit(uri).hostname)
    except ValueError:
        names_host = True
    if names_host and not credential.sends_to(uri):
        raise Unauthorized(
            f"credential {credential.name} was not saved for {_origin_text(uri)}; to use it there, save the "
            "credential again with its secret and this URI among its endpoints"
        )


def _origin_text(uri):
    from core import outbound

    try:
        return outbound.origin(uri)
    except ValueError:
        return "this URI"


def uri_errors(name, uri):
    """Why the driver of kind ``name`` may not be pointed at ``uri`` (its transport or parameters),
    or None. Checked where a URI is accepted (inventory, import, discovery) and again by the
    driver right before it connects, whatever path the URI came by."""
    from urllib.parse import parse_qsl, urlsplit

    spec = KINDS.get(name)
    if spec is None:
        return None
    parts = urlsplit(uri)
    transport = parts.scheme.partition("+")[2]
    if spec.transports is not None and transport not in spec.transports:
        allowed = ", ".join(sorted(f"+{t}" if t else "local" for t in spec.transports))
        return f"transport {transport!r} is not allowed for {name} (use {allowed})"
    params = parse_qsl(parts.query, keep_blank_values=True)
    if spec.uri_params is not None:
        for key, value in params:
            if key not in spec.uri_params:
                allowed = ", ".join(sorted(spec.uri_params))
                return f"URI parameter {key!r} is not allowed for {name} (allowed: {allowed})"
            if key == "socket" and not _trusted_socket(parts, value):
                return "URI parameter 'socket' is allowed only in a local URI, for a socket in VCLMGR_LIBVIRT_SOCKETS"
    return None


def _trusted_socket(parts, path):
    # A private libvirtd's socket (one machine, or the test suite's) is named by the operator in
    # the environment, never by whoever edits the inventory.
    from django.conf import settings

    return not parts.netloc and not parts.scheme.partition("+")[2] and path in settings.VCLMGR_LIBVIRT_SOCKETS


def host_options_errors(name, options, uri=""):
    """``{option: message}`` for a host's ``driver_options`` of kind ``name`` (empty: fine)."""
    if not isinstance(options, dict):
        return {"": f"must be a JSON object, not {type(options).__name__}"}
    spec = KINDS.get(name)
    if spec is None or not spec.option_rules:
        return {}
    return import_string(spec.option_rules)(options, uri)


def options_errors(value):
    """Why ``value`` is not valid ``VCLMGR_DRIVER_OPTIONS`` (an object of objects keyed by kind), or None."""
    return driver_options_errors(value, KINDS)
