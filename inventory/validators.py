"""Field validators and host bounds shared by the models, forms, serializers and the bulk import.

Each bound on a host (its minimum amounts, the overcommit ratios, the slots of a chassis) is
stated here once; the model, the forms, the API serializers, the import and the blade-center
registration all read it from here.

Messages are short and lower-case so they read well after a field name:
``Row 12 address: '10.0.0.300' is not a valid IP address``.
"""

import ipaddress
import re
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator

from drivers import registry as drivers

# --- host bounds -------------------------------------------------------------------------

INT_MAX = 2_147_483_647  # the largest value an integer column holds on every database
# The least value of each host amount (a host needs a CPU and some memory; the rest may be 0).
HOST_MINIMUMS = {
    "cpus": 1, "memory_mib": 1, "disk_gib": 0, "reserved_cpus": 0, "reserved_memory_mib": 0,
    "reserved_disk_gib": 0, "max_vms": 0, "spindles": 0,
}  # fmt: skip
RATIO_MIN, RATIO_MAX = 0.01, 1000  # overcommit ratios (cpu_ratio, memory_ratio, disk_ratio)
RATIO_DEFAULTS = {"cpu_ratio": 4.0, "memory_ratio": 1.0, "disk_ratio": 1.0}
FIRST_SLOT = 1  # a blade center's slots are numbered FIRST_SLOT..slot_count
MAX_SLOTS = 256  # the most slots a blade center has


def ratio_validators():
    return [MinValueValidator(RATIO_MIN), MaxValueValidator(RATIO_MAX)]


def minimum_validators(name):
    """The model validators of a host amount with a minimum above what its column allows."""
    return [MinValueValidator(HOST_MINIMUMS[name])] if HOST_MINIMUMS[name] > 0 else []


# --- field validators --------------------------------------------------------------------

NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")
LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
SCHEME_RE = re.compile(r"^[a-z][a-z0-9+.-]*$")
SPACE_RE = re.compile(r"\s")

# URI schemes each driver understands (the part before a '+': qemu+ssh → qemu).
DRIVER_SCHEMES = drivers.SCHEMES


def validate_name(value):
    """An object name: letters, digits, '.', '_' and '-', starting and ending alphanumeric."""
    if not NAME_RE.match(value or ""):
        raise ValidationError(
            "must be 1–100 letters, digits, '.', '_' or '-', starting and ending with a letter or digit",
            code="invalid",
        )


def validate_address(value):
    """An IPv4/IPv6 address or a DNS host name.

    A value made only of digits and dots must be an IPv4 address: '10.0.0.300' is not
    silently accepted as a host name (RFC 1123 forbids all-numeric top-level labels).
    """
    value = value or ""
    if ":" in value or re.fullmatch(r"[0-9.]+", value):
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValidationError(f"{value!r} is not a valid IP address", code="invalid") from None
        return
    labels = value.rstrip(".").split(".")
    if len(value) > 253 or not all(LABEL_RE.match(label) for label in labels) or labels[-1].isdigit():
        raise ValidationError(f"{value!r} is not a valid IP address or host name", code="invalid")


def uri_errors(uri, driver):
    """Why ``uri`` cannot be used with ``driver``, or None. Blank means 'derive from the address'."""
    if not uri:
        return None
    if SPACE_RE.search(uri):
        return "must not contain spaces"
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError as exc:
        return f"cannot parse {uri!r}: {exc}"
    if "://" not in uri or not SCHEME_RE.match(parts.scheme):
        return f"cannot parse {uri!r}: expected scheme://host/path"
    allowed = DRIVER_SCHEMES.get(driver)
    base = parts.scheme.split("+", 1)[0]
    if allowed is not None and base not in allowed:
        schemes = ", ".join(sorted(allowed))
        return f"scheme {parts.scheme!r} does not suit the {driver} driver (use {schemes})"
    if driver in drivers.KINDS and drivers.KINDS[driver].uri_needs_host and not parts.hostname:
        return f"{uri!r} names no host"
    return drivers.uri_errors(driver, uri)


def validate_bmc_address(value):
    """A Redfish service's base URL: ``https://host[:port]`` (or http), no credentials in it."""
    if not value:
        return
    if SPACE_RE.search(value):
        raise ValidationError("must not contain spaces", code="invalid")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError as exc:
        raise ValidationError(f"cannot parse {value[:100]!r}: {exc}", code="invalid") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValidationError("expected https://host[:port] (or http://)", code="invalid")
    if parts.username or parts.password:
        raise ValidationError("put the login in the BMC credential, not in the address", code="invalid")
