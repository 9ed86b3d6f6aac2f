"""Discovery: read hypervisors from their own APIs and register them through the bulk import.

Contract:

- ``discover(driver, uris, *, actor, …)`` connects to each URI, asks the driver's ``discover()``
  for every host it sees (a vCenter sees many, a libvirt URI one), and turns each host into an
  import record (name, address, driver, uri, credential, group, cpus, memory, disk).
- The records go through ``inventory.services.import_hypervisors`` — the same validation and
  writer as a CSV import: a host whose name exists is updated, a new one created, and a bad
  record (unknown node group, say) rejects the whole batch. A dry run (the default) writes
  nothing and reports per host what a commit would do.
- With ``commit=True``, a vCenter password given as ``username``/``password`` is stored as a
  ``Credential`` (created or updated, named ``<driver>-<host>``) in the same transaction, and the
  facts each driver reported are stored on the hosts (``report_facts``).
- A URI that cannot be reached, or refuses the credentials, raises ``DiscoveryError`` before
  anything is written. Passwords never appear in results, URIs or messages.
- Before a URI is opened its host passes ``core.outbound``'s address check (no loopback,
  link-local or private address unless ``VCLMGR_OUTBOUND_ALLOW`` names it); a URI without a host
  (libvirt's local ``qemu:///system``, ``test:///``) is this machine's and is not checked. A
  stored credential named by ``credential`` is used only for URIs whose origin it was saved for
  (``Credential.endpoints``); a password given here is saved for the URIs it was given with.
"""

import json
import re
import urllib.parse
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core import outbound
from drivers import registry
from inventory import services as inventory
from inventory.models import Credential, Hypervisor
from inventory.validators import validate_address

DRIVERS = registry.DISCOVERABLE


class DiscoveryError(Exception):
    """Nothing was discovered or written; ``permanent`` False: the hypervisor may answer later."""

    def __init__(self, message, permanent=True):
        super().__init__(message)
        self.permanent = permanent


@dataclass
class Discovery:
    """What a discovery found, and what the import did (or, in a dry run, would do) with it."""

    driver: str
    facts: list  # [(uri, HostFacts)] in record order
    records: list
    report: inventory.ImportReport
    credential: str | None = None
    credential_created: bool = False
    notes: list = field(default_factory=list)

    @property
    def committed(self):
        return self.report.committed

    def as_dict(self):
        rows = {row.row: row for row in self.report.rows}
        hosts = []
        for number, (record, (_uri, facts)) in enumerate(zip(self.records, self.facts, strict=True), 1):
            row = rows.get(number)
            hosts.append(
                {
                    **{name: record.get(name) for name in ("name", "address", "uri", "cpus", "memory_mib", "disk_gib")},
                    "group": record.get("group"),
                    "version": facts.version,
                    "vms": facts.vms,
                    "action": row.action if row else None,
                    "id": row.id if row else None,
                    "errors": row.errors if row else [],
                }
            )
        report = self.report.as_dict()
        return {
            "driver": self.driver,
            "dry_run": self.report.dry_run,
            "committed": self.committed,
            "ok": self.report.ok,
            "summary": self.report.summary(),
            "totals": report["totals"],
            "errors": report["errors"],
            "credential": self.credential,
            "credential_created": self.credential_created,
            "hosts": hosts,
        }


def public_uri(uri):
    """``uri`` without any user name or password in it."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def split_credentials(uri, username="", password=""):
    """``(uri without credentials, username, password)``: the URI's user name fills a blank one."""
    try:
        parts = urllib.parse.urlsplit(uri)
        user = urllib.parse.unquote(parts.username or "")
        secret = urllib.parse.unquote(parts.password or "")
    except ValueError as exc:
        raise DiscoveryError(f"cannot parse {public_uri_safe(uri)!r}: {exc}") from None
    return public_uri(uri), username or user, password or secret


def public_uri_safe(uri):
    try:
        return public_uri(uri)
    except ValueError:
        return "(unparsable URI)"


def read(driver, uris, credentials=None):
    """``[(uri, HostFacts)]`` of every host the URIs see. DiscoveryError when one cannot be read."""
    if driver not in DRIVERS:
        raise DiscoveryError(f"unknown driver {driver!r} (one of {', '.join(DRIVERS)})")
    if not uris:
        raise DiscoveryError("no URI to discover")
    found = []
    for uri in uris:
        _check_test_uri(driver, uri)
        _check_address(uri)
        try:
            with registry.get_driver(driver, uri, credentials, options=_driver_options(driver)) as connection:
                hosts = connection.discover()
        except registry.DriverError as exc:
            message = _without_secret(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, credentials)
            raise DiscoveryError(f"{public_uri(uri)}: {message}", exc.permanent) from None
        for facts in hosts:
            found.append((host_uri(driver, uri, facts), facts))
    return found


def _driver_options(kind):
    """The options discovery gives a driver: the same ``VCLMGR_DRIVER_OPTIONS`` as the workers use."""
    return registry.options_for(kind)


def _check_test_uri(driver, uri):
    """libvirt's test driver reads any file it is given: only its default node or a node XML file."""
    parts = urllib.parse.urlsplit(uri)
    if driver == "libvirt" and parts.scheme == "test" and not (parts.path == "/default" or parts.path.endswith(".xml")):
        raise DiscoveryError(f"{uri!r}: a test URI is test:///default or test:///path/to/node.xml")


def _check_address(uri):
    try:
        parts = urllib.parse.urlsplit(uri)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise DiscoveryError(f"cannot parse {public_uri_safe(uri)!r}: {exc}") from None
    if not host:
        return
    try:
        outbound.check_host(host, port)
    except outbound.Refused as exc:
        hint = "VCLMGR_OUTBOUND_ALLOW names exceptions"
        raise DiscoveryError(f"{public_uri(uri)}: not allowed: {exc} ({hint})") from None
    except outbound.Failed as exc:
        raise DiscoveryError(f"{public_uri(uri)}: {exc}", permanent=False) from None


def _check_binding(stored, uris):
    for uri in uris:
        try:
            registry.check_binding(stored, uri)
        except registry.Unauthorized as exc:
            raise DiscoveryError(str(exc)) from None


def _without_secret(message, credentials):
    secret = (credentials or {}).get("password")
    return message.replace(secret, "***") if secret else message


def host_uri(driver, uri, facts):
    """The URI that reaches this one host: a vCenter's URL names the host in ``?host=``."""
    if driver != "vmware":
        return uri
    parts = urllib.parse.urlsplit(uri)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "host"] + [("host", facts.name)]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, urllib.parse.urlencode(query), ""))


NAME_JUNK = re.compile(r"[^A-Za-z0-9._-]+")


def record(driver, uri, facts, *, group=None, credential=None):
    """The import row for one discovered host (only the columns discovery knows about)."""
    name = NAME_JUNK.sub("-", facts.name).strip("-._")[:100] or "host"
    row = {
        "name": name,
        "address": _address(uri, facts),
        "driver": driver,
        "uri": uri,
        "cpus": facts.cpus,
        "memory_mib": facts.memory_mib,
        "disk_gib": facts.disk_gib,
    }
    if group:
        row["group"] = group
    if credential:
        row["credential"] = credential
    return row


def _address(uri, facts):
    """The host's management address: as reported, else its name, else the URI's host."""
    for candidate in ((facts.extra or {}).get("address"), facts.name, urllib.parse.urlsplit(uri).hostname):
        try:
            validate_address(candidate)
        except ValidationError:
            continue
        return candidate
    return "localhost"


def discover(driver, uris, *, actor, username="", password="", credential=None, group=None, commit=False, reason=""):
    """Read the hosts the URIs see and import them (a dry run unless ``commit``). See the module doc."""
    if isinstance(uris, str):
        uris = [uris]
    cleaned, user, secret = [], username, password
    for uri in uris:
        plain, user, secret = split_credentials(uri, user, secret)
        cleaned.append(plain)
    stored = None
    if credential:
        stored = Credential.objects.filter(name=credential).first()
        if stored is None:
            raise DiscoveryError(f"no credential named {credential!r}")
        _check_binding(stored, cleaned)
        user, secret = user or stored.username, secret or stored.get_secret()
    credentials = {"username": user, "password": secret} if (user or secret) else None
    found = read(driver, cleaned, credentials)
    if not found:
        raise DiscoveryError(f"{', '.join(cleaned)}: the driver sees no host")
    credential_name = credential or (_credential_name(driver, cleaned[0]) if secret else None)
    records = [record(driver, uri, facts, group=group, credential=credential_name) for uri, facts in found]
    why = reason or f"discovered at {', '.join(cleaned)}"
    with transaction.atomic():
        created = False
        if credential_name and not credential:  # store the password given (on a dry run: rolled back)
            created = _store_credential(actor, credential_name, user, secret, why, cleaned)
        report = inventory.import_hypervisors(
            json.dumps(records).encode(),
            "json",
            actor=actor,
            dry_run=not commit,
            file_name=f"{driver} discovery",
            reason=why,
        )
        if commit and report.ok:
            _report_facts(actor, report, found)
        else:
            transaction.set_rollback(True)
    return Discovery(driver, found, records, report, credential_name, created)


def _credential_name(driver, uri):
    host = urllib.parse.urlsplit(uri).hostname or "host"
    return NAME_JUNK.sub("-", f"{driver}-{host}").strip("-._")[:100]


def _store_credential(actor, name, username, secret, reason, uris):
    """Saved for the URIs it was given with (and, updated, for those it was saved for before)."""
    existing = Credential.objects.filter(name=name).first()
    if existing is None:
        inventory.create_credential(
            actor=actor, name=name, username=username, secret=secret, endpoints=uris, description="stored by discovery"
        )
        return True
    endpoints = inventory.clean_endpoints([*existing.endpoints, *uris])
    if existing.username != username or existing.get_secret() != secret or endpoints != sorted(existing.endpoints):
        inventory.update_credential(
            existing, actor=actor, secret=secret, username=username, endpoints=endpoints, reason=reason
        )
    return False


def _report_facts(actor, report, found):
    checked = timezone.now().isoformat()
    ids = [row.id for row in report.rows]
    hosts = Hypervisor.objects.in_bulk([pk for pk in ids if pk])
    for pk, (_uri, facts) in zip(ids, found, strict=True):
        if pk in hosts:
            inventory.report_facts(hosts[pk], {**facts.as_dict(), "reachable": True, "checked": checked}, actor=actor)
