"""The libvirt driver's options, checked where a host's ``driver_options`` are saved (the
inventory's create and update: page, admin, API) and by the driver itself. Pure: importing
this module does not import libvirt, so a web process can validate without it.

``errors(options, uri)`` → ``{option: message}``, empty when all is well.
"""

import ipaddress
import re

DOMAIN_TYPES = ("kvm", "qemu")  # ``test`` only for libvirt's test:// driver
CPU_MODES = ("host-model", "host-passthrough", "maximum", "none")
# ``default``: QEMU's own (writeback through the host page cache); the others are libvirt's.
DISK_CACHES = ("none", "writeback", "writethrough", "directsync", "unsafe", "default")
OPTIONS = (
    "pool",
    "name",
    "domain_type",
    "cpu_mode",
    "disk_cache",
    "network",
    "stop_timeout",
    "shared_storage",
    "vnc_listen",
)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # pools and networks: no spaces, no XML
BRIDGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$")  # a Linux interface name (IFNAMSIZ 16)


def errors(options, uri=""):
    if not isinstance(options, dict):
        return {"": f"must be a JSON object, not {type(options).__name__}"}
    found = {}
    for key in sorted(set(options) - set(OPTIONS)):
        found[key] = f"is not a libvirt option (known: {', '.join(OPTIONS)})"
    domain_type = options.get("domain_type")
    allowed = (*DOMAIN_TYPES, "test") if str(uri).startswith("test:") else DOMAIN_TYPES
    if "domain_type" in options and domain_type not in allowed:
        found["domain_type"] = f"{domain_type!r}: one of {', '.join(allowed)} (qemu: software emulation)"
    cpu_mode = options.get("cpu_mode")
    if "cpu_mode" in options:
        custom = isinstance(cpu_mode, str) and cpu_mode.startswith("custom:") and NAME_RE.match(cpu_mode[7:])
        if cpu_mode not in CPU_MODES and not custom:
            found["cpu_mode"] = f"{cpu_mode!r}: one of {', '.join(CPU_MODES)} or custom:<model>"
        elif domain_type == "qemu" and cpu_mode.startswith("host-"):
            found["cpu_mode"] = f"{cpu_mode!r} needs domain_type kvm (software emulation has no host CPU)"
    if "disk_cache" in options and options["disk_cache"] not in DISK_CACHES:
        found["disk_cache"] = f"{options['disk_cache']!r}: one of {', '.join(DISK_CACHES)}"
    if "pool" in options and not _name(options["pool"]):
        found["pool"] = f"{options['pool']!r}: not a storage pool name"
    if "name" in options and not (isinstance(options["name"], str) and options["name"].strip()):
        found["name"] = f"{options['name']!r}: a non-empty host name"
    if "network" in options:
        problem = network_error(options["network"])
        if problem:
            found["network"] = problem
    timeout = options.get("stop_timeout")
    positive = isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0
    if "stop_timeout" in options and not positive:
        found["stop_timeout"] = f"{timeout!r}: seconds, a positive number"
    if "shared_storage" in options and not isinstance(options["shared_storage"], bool):
        found["shared_storage"] = f"{options['shared_storage']!r}: true or false"
    if "vnc_listen" in options and vnc_listen_error(options["vnc_listen"]):
        found["vnc_listen"] = vnc_listen_error(options["vnc_listen"])
    return found


def vnc_listen_error(value):
    """``vnc_listen``: the address the VMs' VNC displays listen on (an IP address), or ``none``."""
    if value == "none":
        return None
    try:
        ipaddress.ip_address(value if isinstance(value, str) else None)
    except (TypeError, ValueError):
        return f"{value!r}: an IP address for the VNC displays (default 127.0.0.1), or none"
    return None


def network_error(value):
    """Why ``value`` is none of the network forms: a libvirt network, ``bridge:<name>``, ``user``."""
    if isinstance(value, str) and value.startswith("bridge:"):
        if BRIDGE_RE.match(value[7:]):
            return None
        return f"{value!r}: bridge:<interface name> (at most 15 letters, digits, '.', '_', '-')"
    if _name(value):
        return None
    return f"{value!r}: a libvirt network name, bridge:<name>, or user (QEMU user-mode networking)"


def _name(value):
    return isinstance(value, str) and bool(NAME_RE.match(value))
