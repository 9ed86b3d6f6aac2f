"""Inventory operations: the one place each write happens (views, API, CLI, jobs call these).

Every function validates, writes in one transaction, records the change log with who and
why (``actor=``, keyword-only: a user, or an ``Actor`` such as ``Actor(name="cli")``) and emits events
as outbox rows in that same transaction. Invalid input raises Django's
``ValidationError`` (a dict of field → messages) and writes nothing.

The layers above extend it through hooks (``core.hooks``) they fill in their
``AppConfig.ready()``: ``IN_USE_CHECKERS`` vetoes deleting a hypervisor (capacity and
provisioning say why the host is still in use: live claims, VMs running on it), ``ON_STATE_CHANGE``
follows a state change inside ``set_state``'s transaction (reservations submits the job that
moves its future claims off a drained or offline host), ``CLAIMS_END`` says when what a host
holds ends (capacity's claims).
"""

import ipaddress
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import tablib
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone

from core import bulk, changelog, events, outbound
from core.errors import InUse
from core.hooks import Hook
from drivers import registry as drivers
from inventory import formats
from inventory.devices import device_errors
from inventory.models import BladeCenter, Credential, Hypervisor, NodeGroup
from inventory.resources import (
    IMPORT_ACTIONS,
    HypervisorResource,
    TagsWidget,
    amount_default,
    amount_widget,
    host_data,
    row_messages,
    slot_data,
)
from inventory.validators import FIRST_SLOT, MAX_SLOTS, validate_name

# ``(hypervisor) -> str | None``: why the host is still in use, or None.
IN_USE_CHECKERS: Hook[Callable[[Hypervisor], str | None]] = Hook("inventory.services.IN_USE_CHECKERS")
# ``(hypervisor, old_state, *, actor)``: in set_state's transaction; raising rolls the change back.
ON_STATE_CHANGE: Hook[Callable[..., None]] = Hook("inventory.services.ON_STATE_CHANGE")
# ``(hypervisor_id) -> datetime``: when what the host holds ends.
CLAIMS_END: Hook[Callable[[int], datetime]] = Hook("inventory.services.CLAIMS_END")

HOST_FIELDS = [
    "name", "address", "driver", "uri", "credential", "blade_center", "slot", "group",
    "cpus", "memory_mib", "disk_gib", "cpu_ratio", "memory_ratio", "disk_ratio",
    "reserved_cpus", "reserved_memory_mib", "reserved_disk_gib", "max_vms", "spindles", "overlay", "driver_options",
    "devices", "bmc_address", "bmc_credential", "bmc_system", "bmc_verify_tls", "bmc_allow_http",
]  # fmt: skip
CREDENTIAL_FIELDS = ["name", "username", "description"]
GROUP_FIELDS = ["name", "alloc_policy", "exclusive_storage", "placement_policy", "iallocator", "description"]
CHASSIS_FIELDS = [
    "name",
    "site",
    "model",
    "slot_count",
    "management_address",
    "notes",
    "bmc_address",
    "bmc_credential",
    "bmc_verify_tls",
    "bmc_allow_http",
]


# --- shared plumbing ------------------------------------------------------------------


def _values(obj, names):
    values = {}
    for name in names:
        value = getattr(obj, name)
        values[name] = value.name if hasattr(value, "_meta") else value
    return values


def _apply(actor, obj, names, changes_in, action, reason="", extra_changes=None):
    """Set fields, validate, save, log. Returns the {field: [old, new]} changes."""
    unknown = set(changes_in) - set(names)
    if unknown:
        raise TypeError(f"cannot set {sorted(unknown)} on {type(obj).__name__}")
    before = _values(obj, names) if action == "update" else dict.fromkeys(names)
    for name, value in changes_in.items():
        setattr(obj, name, value)
    obj.full_clean()
    changes = changelog.diff(before, _values(obj, names), names)
    changes.update(extra_changes or {})
    if action == "update" and not changes:
        return changes
    obj.save()
    changelog.record(obj, action, actor, changes, reason)
    return changes


def _emit(kind, data, topics):
    events.emit(kind, data, topics)


# --- credentials ----------------------------------------------------------------------


def clean_endpoints(endpoints):
    """The origins a credential may be sent to, from URLs (``https://bmc.example.org/redfish`` →
    ``https://bmc.example.org:443``); ValidationError for one that names no host."""
    if isinstance(endpoints, str):
        endpoints = endpoints.split()
    origins, errors = set(), []
    for url in endpoints or ():
        try:
            origins.add(outbound.origin(str(url).strip()))
        except ValueError as exc:
            errors.append(f"{str(url)[:100]!r}: {exc}" if "names no host" not in str(exc) else str(exc))
    if errors:
        raise ValidationError({"endpoints": errors})
    return sorted(origins)


@transaction.atomic
def create_credential(*, actor, secret="", endpoints=(), **fields):
    """``endpoints``: the URLs (BMCs, vCenters) the secret may be sent to; nowhere else."""
    credential = Credential()
    credential.set_secret(secret)
    credential.endpoints = clean_endpoints(endpoints)
    extra = {"secret": ["***", "***"]} if secret else {}
    if credential.endpoints:
        extra["endpoints"] = [[], credential.endpoints]
    _apply(actor, credential, CREDENTIAL_FIELDS, fields, "create", extra_changes=extra)
    _emit("credential.changed", {"id": credential.pk, "name": credential.name, "action": "created"}, ["admin"])
    return credential


@transaction.atomic
def update_credential(credential, *, actor, secret=None, endpoints=None, reason="", **fields):
    """``secret=None`` keeps the stored secret; ``""`` removes it; anything else replaces it.
    ``endpoints`` (None: kept) change only with the secret given in the same call: whoever may
    edit a credential but does not know its secret cannot send it somewhere new."""
    extra = {}
    if endpoints is not None:
        endpoints = clean_endpoints(endpoints)
        if endpoints != sorted(credential.endpoints) and not secret:
            raise ValidationError({"endpoints": ["give the secret again to change where it may be sent"]})
        if endpoints != sorted(credential.endpoints):
            extra["endpoints"] = [sorted(credential.endpoints), endpoints]
            credential.endpoints = endpoints
    if secret is not None and (secret or credential.has_secret):
        credential.set_secret(secret)
        extra["secret"] = ["***", "***"]
    changes = _apply(actor, credential, CREDENTIAL_FIELDS, fields, "update", reason, extra)
    if changes:
        _emit("credential.changed", {"id": credential.pk, "name": credential.name, "action": "updated"}, ["admin"])
    return credential


@transaction.atomic
def delete_credential(credential, *, actor, reason=""):
    used = credential.hypervisors.count()
    if used:
        raise InUse(f"credential {credential.name} is used by {used} hypervisor(s); give them another first")
    bmcs = credential.bmc_hosts.count() + credential.bmc_blade_centers.count()
    if bmcs:
        raise InUse(
            f"credential {credential.name} logs in to {bmcs} BMC(s) (hosts or blade centers); give them another first"
        )
    _delete(actor, credential, reason, "credential.changed")


def _delete(actor, obj, reason, kind, topics=("admin",)):
    changelog.record(obj, "delete", actor, {}, reason)
    pk, name = obj.pk, obj.name
    try:
        obj.delete()
    except ProtectedError as exc:
        raise InUse(f"{name} is still referenced by {len(exc.protected_objects)} object(s)") from None
    _emit(kind, {"id": pk, "name": name, "action": "deleted"}, list(topics))


# --- node groups ----------------------------------------------------------------------


@transaction.atomic
def create_node_group(*, actor, **fields):
    group = NodeGroup()
    _apply(actor, group, GROUP_FIELDS, fields, "create")
    _emit("nodegroup.changed", {"id": group.pk, "name": group.name, "action": "created"}, ["admin"])
    return group


@transaction.atomic
def update_node_group(group, *, actor, reason="", **fields):
    if _apply(actor, group, GROUP_FIELDS, fields, "update", reason):
        _emit("nodegroup.changed", {"id": group.pk, "name": group.name, "action": "updated"}, ["admin"])
    return group


@transaction.atomic
def delete_node_group(group, *, actor, reason=""):
    used = group.hypervisors.count()
    if used:
        raise InUse(f"node group {group.name} still has {used} hypervisor(s); move them first")
    _delete(actor, group, reason, "nodegroup.changed")


# --- blade centers --------------------------------------------------------------------


def blade_center_errors(chassis):
    """Rules needing the database: the slot count must keep every occupied slot."""
    if chassis.pk is None or not isinstance(chassis.slot_count, int):
        return {}
    highest = chassis.hypervisors.order_by("-slot").values_list("slot", flat=True).first()
    if highest and highest > chassis.slot_count:
        return {"slot_count": [f"slot {highest} is occupied: the chassis needs at least {highest} slots"]}
    return {}


@transaction.atomic
def create_blade_center(*, actor, reason="", **fields):
    chassis = BladeCenter()
    _apply(actor, chassis, CHASSIS_FIELDS, fields, "create", reason)
    _emit("bladecenter.changed", {"id": chassis.pk, "name": chassis.name, "action": "created"}, ["admin"])
    return chassis


@transaction.atomic
def update_blade_center(chassis, *, actor, reason="", **fields):
    probe = BladeCenter(pk=chassis.pk, slot_count=fields.get("slot_count", chassis.slot_count))
    errors = blade_center_errors(probe)
    if errors:
        raise ValidationError(errors)
    if _apply(actor, chassis, CHASSIS_FIELDS, fields, "update", reason):
        data = {"id": chassis.pk, "name": chassis.name, "slot_count": chassis.slot_count, "action": "updated"}
        _emit("bladecenter.changed", data, ["admin", f"bladecenter.{chassis.pk}"])
    return chassis


@transaction.atomic
def delete_blade_center(chassis, *, actor, reason=""):
    held = chassis.hypervisors.count()
    if held:
        raise InUse(f"blade center {chassis.name} still holds {held} hypervisor(s); delete or move them first")
    _delete(actor, chassis, reason, "bladecenter.changed", ["admin", f"bladecenter.{chassis.pk}"])


# --- hypervisors ----------------------------------------------------------------------


def _clean_tags(tags):
    try:
        return TagsWidget().clean(list(tags) if not isinstance(tags, str) else tags)
    except ValueError as exc:
        raise ValidationError({"tags": [str(exc)]}) from None


def _host_topics(hv, *chassis_ids):
    topics = [f"hypervisor.{hv.pk}", "admin"]
    topics += [f"bladecenter.{c}" for c in dict.fromkeys((hv.blade_center_id, *chassis_ids)) if c is not None]
    return topics


@transaction.atomic
def create_hypervisor(*, actor, tags=(), reason="", **fields):
    tags = _clean_tags(tags)
    hv = Hypervisor()
    extra = {"tags": [[], tags]} if tags else {}
    _apply(actor, hv, HOST_FIELDS, fields, "create", reason, extra)
    if tags:
        hv.tags.set(tags)
    _emit("hypervisor.changed", host_data(hv, action="created"), _host_topics(hv))
    return hv


@transaction.atomic
def update_hypervisor(hv, *, actor, tags=None, reason="", **fields):
    """Change fields (and tags when given). The state changes through ``set_state``."""
    old_chassis, old_slot = hv.blade_center_id, hv.slot
    extra = {}
    if tags is not None:
        tags, before = _clean_tags(tags), sorted(t.name for t in hv.tags.all())
        if tags != before:
            extra["tags"] = [before, tags]
    if not _apply(actor, hv, HOST_FIELDS, fields, "update", reason, extra):
        return hv
    if "tags" in extra:
        hv.tags.set(tags)
    data = host_data(hv, action="updated")
    if old_chassis is not None and (old_chassis, old_slot) != (hv.blade_center_id, hv.slot):
        freed = {"slot": old_slot, "id": None, "name": None, "state": None}
        if old_chassis == hv.blade_center_id:
            data["slots"] = [*data["slots"], freed]
        else:  # the old chassis page only needs to empty its slot
            _emit("hypervisor.changed", {**data, "slots": [freed]}, [f"bladecenter.{old_chassis}"])
    _emit("hypervisor.changed", data, _host_topics(hv))
    return hv


def in_use_reasons(hv):
    return [reason for check in IN_USE_CHECKERS if (reason := check(hv))]


@transaction.atomic
def delete_hypervisor(hv, *, actor, reason=""):
    """Delete a host, unless something (VMs running on it) holds it: then ``InUse``."""
    reasons = in_use_reasons(hv)
    if reasons:
        raise InUse(f"hypervisor {hv.name} is in use: {'; '.join(reasons)}")
    data = host_data(hv, action="deleted")
    data["slots"] = [{"slot": hv.slot, "id": None, "name": None, "state": None}] if hv.blade_center_id else []
    topics = _host_topics(hv)
    changelog.record(hv, "delete", actor, {}, reason)
    hv.delete()
    _emit("hypervisor.changed", data, topics)


@transaction.atomic
def set_state(hv, state, reason, *, actor):
    """online / drained (takes no new VMs) / offline (takes nothing); a reason is required.

    Returns True when something changed. The row is locked so concurrent changes queue up.
    """
    errors = {}
    if state not in Hypervisor.State.values:
        errors["state"] = [f"unknown state {str(state)[:30]!r} (use online, drained or offline)"]
    reason = (reason or "").strip()
    if not reason:
        errors["reason"] = ["required: say why the state changes"]
    elif len(reason) > 500:
        errors["reason"] = ["at most 500 characters"]
    if errors:
        raise ValidationError(errors)
    locked = Hypervisor.objects.select_for_update().get(pk=hv.pk)
    if locked.state == state and locked.state_reason == reason:
        return False
    actor = changelog.Actor.of(actor)
    changes = changelog.diff(
        {"state": locked.state, "state_reason": locked.state_reason},
        {"state": state, "state_reason": reason},
        ["state", "state_reason"],
    )
    now = timezone.now()
    Hypervisor.objects.filter(pk=hv.pk).update(
        state=state, state_reason=reason, state_changed_by=actor.label[:150], state_changed_at=now, updated=now
    )
    hv.state, hv.state_reason, hv.state_changed_by, hv.state_changed_at = state, reason, actor.label[:150], now
    changelog.record(hv, "state", actor, changes, reason)
    if locked.scheduled_state and state in (locked.scheduled_state, Hypervisor.State.OFFLINE):
        _clear_schedule(hv)  # done (or overtaken): it no longer waits for its reservations
    _emit("hypervisor.state", host_data(hv, by=actor.label), _host_topics(hv))
    for hook in ON_STATE_CHANGE:
        hook(hv, locked.state, actor=actor)
    return True


SCHEDULE_FIELDS = ("scheduled_state", "scheduled_reason", "scheduled_until", "scheduled_by")


def _clear_schedule(hv):
    Hypervisor.objects.filter(pk=hv.pk).update(
        scheduled_state="", scheduled_reason="", scheduled_until=None, scheduled_by="", updated=timezone.now()
    )
    hv.scheduled_state, hv.scheduled_reason, hv.scheduled_until, hv.scheduled_by = "", "", None, ""


@transaction.atomic
def schedule_state(hv, state, reason, *, actor):
    """Schedule ``state`` (drained or offline) for when the host's current reservations end
    (the moment comes from ``CLAIMS_END``, registered by capacity, under the host's row lock).
    From now on placement gives it nothing that outlasts that moment; the reservations clock
    makes the change once the last has ended (``capacity.services.apply_scheduled``)."""
    hv = Hypervisor.objects.select_for_update().get(pk=hv.pk)
    errors = {}
    if state not in (Hypervisor.State.DRAINED, Hypervisor.State.OFFLINE):
        errors["state"] = [f"only drained or offline can be scheduled, not {str(state)[:30]!r}"]
    reason = (reason or "").strip()
    if not reason:
        errors["reason"] = ["required: say why the state changes"]
    elif len(reason) > 400:
        errors["reason"] = ["at most 400 characters"]
    if (
        not errors
        and hv.state != Hypervisor.State.ONLINE
        and not (hv.state == Hypervisor.State.DRAINED and state == Hypervisor.State.OFFLINE)
    ):
        errors["state"] = [f"{hv.name} is {hv.state} already"]
    if errors:
        raise ValidationError(errors)
    actor = changelog.Actor.of(actor)
    until = max([timezone.now(), *(moment(hv.pk) for moment in CLAIMS_END)])
    before = {name: getattr(hv, name) for name in SCHEDULE_FIELDS}
    Hypervisor.objects.filter(pk=hv.pk).update(
        scheduled_state=state,
        scheduled_reason=reason,
        scheduled_until=until,
        scheduled_by=actor.label[:150],
        updated=timezone.now(),
    )
    hv.scheduled_state, hv.scheduled_reason, hv.scheduled_until, hv.scheduled_by = state, reason, until, actor.label
    after = {name: getattr(hv, name) for name in SCHEDULE_FIELDS}
    changelog.record(hv, "update", actor, changelog.diff(before, after, list(SCHEDULE_FIELDS)), reason)
    _emit(
        "hypervisor.state",
        host_data(hv, by=actor.label, scheduled_state=state, scheduled_until=until.isoformat()),
        _host_topics(hv),
    )
    return hv


@transaction.atomic
def cancel_schedule(hv, reason="", *, actor):
    """Drop a scheduled state change; the host takes long reservations again. Idempotent."""
    locked = Hypervisor.objects.select_for_update().get(pk=hv.pk)
    if not locked.scheduled_state:
        return False
    actor = changelog.Actor.of(actor)
    changelog.record(
        hv,
        "update",
        actor,
        {"scheduled_state": [locked.scheduled_state, ""]},
        reason or "scheduled state change canceled",
    )
    _clear_schedule(hv)
    _emit("hypervisor.state", host_data(hv, by=actor.label, scheduled_state=""), _host_topics(hv))
    return True


@transaction.atomic
def report_facts(hv, facts, *, actor):
    """Store what the driver reports about the host (capacity discovery calls this). Devices
    reported (``facts["devices"]``, a list) replace the host's ``devices``, with a change-log
    row when they differ; a driver that cannot tell reports None and leaves them as they are."""
    if not isinstance(facts, dict):
        raise ValidationError({"facts": ["must be an object"]})
    now = timezone.now()
    changes = {"facts": facts, "facts_updated_at": now}
    reported = facts.get("devices")
    if reported is not None and facts.get("reachable", True) and reported != hv.devices:
        error = device_errors(reported)
        if error:
            raise ValidationError({"devices": [error]})
        changelog.record(hv, "update", actor, {"devices": [hv.devices, reported]}, "devices reported by the driver")
        changes["devices"] = reported
        changes["updated"] = now  # placement's snapshots reload on a host's change of ``updated``
    Hypervisor.objects.filter(pk=hv.pk).update(**changes)
    for name, value in changes.items():
        setattr(hv, name, value)


# --- bulk import and export -----------------------------------------------------------


@dataclass
class RowReport:
    row: int
    action: str  # create / update / unchanged / reject
    name: str
    id: int | None = None
    errors: list = field(default_factory=list)


@dataclass
class ImportReport:
    """What an import did (or, in a dry run, would do), row by row.

    Rows are numbered from 1, the first row after the header (the first item in JSON/YAML).
    """

    dry_run: bool
    rows: list = field(default_factory=list)
    file_errors: list = field(default_factory=list)
    committed: bool = False

    @property
    def totals(self):
        totals = {"create": 0, "update": 0, "unchanged": 0, "reject": 0}
        for row in self.rows:
            totals[row.action] = totals.get(row.action, 0) + 1
        return totals

    @property
    def ok(self):
        return not self.file_errors and not any(r.action == "reject" for r in self.rows)

    def messages(self):
        return [*self.file_errors, *(m for row in self.rows for m in row.errors)]

    def summary(self):
        t = self.totals
        errors = t["reject"] + len(self.file_errors)
        return f"created {t['create']}, updated {t['update']}, errors {errors} ({t['unchanged']} unchanged)"

    def as_dict(self):
        t = self.totals
        return {
            "dry_run": self.dry_run,
            "committed": self.committed,
            "ok": self.ok,
            "summary": self.summary(),
            "totals": {
                "created": t["create"],
                "updated": t["update"],
                "unchanged": t["unchanged"],
                "rejected": t["reject"],
                "rows": len(self.rows),
            },
            "errors": self.messages(),
            "rows": [
                {"row": r.row, "action": r.action, "name": r.name, "id": r.id, "errors": r.errors} for r in self.rows
            ],
        }


def _name_cells(dataset):
    if "name" not in (dataset.headers or []):
        return [""] * len(dataset)
    return ["" if v is None else str(v) for v in dataset.get_col(dataset.headers.index("name"))]


def _run_import(dataset, *, actor, dry_run, reason="", file_name="", create_only=False):
    with bulk.gc_paused():
        result = HypervisorResource().import_data(
            dataset,
            dry_run=dry_run,
            actor=actor,
            reason=reason,
            file_name=file_name,
            create_only=create_only,
            retain_instance_in_row_result=True,
        )
    report = ImportReport(dry_run=dry_run)
    report.file_errors = [str(error.error) for error in result.base_errors]
    names = _name_cells(dataset)
    for number, row_result in enumerate(result.rows, 1):
        instance = getattr(row_result, "instance", None)
        object_id = instance.pk if instance is not None and not dry_run else row_result.object_id
        report.rows.append(
            RowReport(
                row=number,
                action=IMPORT_ACTIONS.get(row_result.import_type, row_result.import_type),
                name=row_result.object_repr or (names[number - 1] if number <= len(names) else ""),
                id=int(object_id) if object_id not in (None, "") else None,
                errors=row_messages(number, row_result),
            )
        )
    report.committed = not dry_run and report.ok
    return report


def import_hypervisors(data, fmt, *, actor, dry_run=False, file_name="", reason=""):
    """Import a file (bytes) of hypervisors: all rows or none. Returns an ``ImportReport``."""
    try:
        dataset = formats.load(data, fmt)
    except formats.FileError as exc:
        return ImportReport(dry_run=dry_run, file_errors=[str(exc)])
    return _run_import(dataset, actor=actor, dry_run=dry_run, reason=reason, file_name=file_name)


def export_hypervisors(fmt, queryset=None, *, with_id=True):
    """Bytes of a file in ``fmt`` that ``import_hypervisors`` reads back unchanged."""
    resource = HypervisorResource()
    fields = None if with_id else [name for name in resource.get_export_order() if name != "id"]
    dataset = resource.export(queryset, export_fields=fields)
    return formats.dump(dataset, fmt)


# --- registering a whole blade center -------------------------------------------------

PATTERN_FIELDS = {"slot", "index", "chassis"}
# Per-host amounts a registration sets (the same for every host; cpus, memory and disk required).
REGISTRATION_AMOUNTS = (
    "cpus",
    "memory_mib",
    "disk_gib",
    "cpu_ratio",
    "memory_ratio",
    "disk_ratio",
    "reserved_cpus",
    "reserved_memory_mib",
    "reserved_disk_gib",
)
URI_FIELDS = {"slot", "index", "chassis", "name", "address"}


@dataclass
class Registration:
    blade_center: BladeCenter
    hosts: list  # the rows as registered: name, slot, address, uri
    report: ImportReport


def _check_template(template, allowed, key, errors, sample):
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        errors[key] = [f"cannot parse {template!r}: {exc}"]
        return
    for _, field_name, _, _ in parsed:
        if field_name is None:
            continue
        if field_name not in allowed:
            names = ", ".join("{" + n + "}" for n in sorted(allowed))
            errors[key] = [f"unknown placeholder {{{field_name}}} (use {names})"]
            return
    try:
        template.format(**sample)
    except (ValueError, TypeError) as exc:
        errors[key] = [f"cannot fill {template!r}: {exc}"]


def _registration_slots(spec, errors):
    """``(slot_count, first slot, last slot)`` of a registration spec; an empty range when invalid."""
    count = spec.get("slot_count")
    if not isinstance(count, int) or not FIRST_SLOT <= count <= MAX_SLOTS:
        errors["slot_count"] = [f"must be a whole number from {FIRST_SLOT} to {MAX_SLOTS}"]
        count = MAX_SLOTS
    first = spec.get("first_slot") or FIRST_SLOT
    last = spec.get("last_slot") or count
    if not isinstance(first, int) or not isinstance(last, int) or not FIRST_SLOT <= first <= last <= count:
        errors["last_slot"] = [f"the slot range must lie within {FIRST_SLOT}–{count}, first ≤ last"]
        first, last = FIRST_SLOT, FIRST_SLOT - 1
    return count, first, last


def _registration_name(spec, errors):
    name = spec.get("name") or ""
    try:
        validate_name(name)
    except ValidationError as exc:
        errors["name"] = exc.messages
    if BladeCenter.objects.filter(name=name).exists():
        errors["name"] = [f"a blade center named {name!r} already exists"]
    return name


def _registration_plan(spec):
    """Validate a registration spec; returns (chassis fields, rows) or raises ValidationError."""
    errors = {}
    count, first, last = _registration_slots(spec, errors)
    name = _registration_name(spec, errors)

    pattern = spec.get("hostname_pattern") or "{chassis}-s{slot:02d}"
    uri_template = spec.get("uri_template") or ""
    sample = {"slot": first, "index": 1, "chassis": name, "name": name, "address": "192.0.2.1"}
    _check_template(pattern, PATTERN_FIELDS, "hostname_pattern", errors, sample)
    _check_template(uri_template, URI_FIELDS, "uri_template", errors, sample)
    try:
        address = ipaddress.ip_address(str(spec.get("first_address") or "").strip())
        address + max(0, last - first)  # noqa: B018 (raises past the end of the address space)
    except (ValueError, ipaddress.AddressValueError):
        errors["first_address"] = ["must be an IP address with room for one address per slot after it"]
        address = None

    values = {}
    for key in REGISTRATION_AMOUNTS:
        try:
            value = amount_widget(key).clean(spec.get(key))
        except ValueError as exc:
            errors[key] = [str(exc)]
            continue
        default = amount_default(key)
        if value is None and default is None:
            errors[key] = ["required"]
        values[key] = default if value is None else value
    if (spec.get("driver") or "sim") not in Hypervisor.Driver.values:
        errors["driver"] = [f"unknown driver {str(spec.get('driver'))[:30]!r} (use {drivers.names_text()})"]
    for key, model, label in (
        ("credential", Credential, "credential"),
        ("group", NodeGroup, "node group"),
        ("bmc_credential", Credential, "credential"),
    ):
        wanted = spec.get(key)
        if wanted and not model.objects.filter(name=wanted).exists():
            errors[key] = [f"no {label} named {wanted!r}"]
    try:
        tags = _clean_tags(spec.get("tags") or [])
    except ValidationError as exc:
        errors.update(exc.message_dict)
        tags = []
    if errors:
        raise ValidationError(errors)

    chassis = {key: spec.get(key) or "" for key in ("site", "model", "management_address", "notes", "bmc_address")}
    chassis.update(name=name, slot_count=count)
    if spec.get("bmc_credential"):
        chassis["bmc_credential"] = Credential.objects.get(name=spec["bmc_credential"])
    rows = []
    for index, slot in enumerate(range(first, last + 1), 1):
        fill = {"slot": slot, "index": index, "chassis": name}
        host = pattern.format(**fill)
        host_address = str(address + (index - 1))
        rows.append(
            {
                "name": host,
                "address": host_address,
                "driver": spec.get("driver") or "sim",
                "uri": uri_template.format(**fill, name=host, address=host_address),
                "credential": spec.get("credential"),
                "blade_center": name,
                "slot": slot,
                "group": spec.get("group"),
                **values,
                "tags": ", ".join(tags),
            }
        )
    return chassis, rows


def register_blade_center(spec, *, actor, dry_run=False):
    """Create a blade center and one hypervisor per slot in its range, all or nothing.

    ``spec``: name, slot_count, optional site/model/management_address/notes/bmc_address (the
    chassis' Redfish service) and bmc_credential (by name), first_slot and
    last_slot (default: all), hostname_pattern (default ``{chassis}-s{slot:02d}``),
    first_address (consecutive addresses follow), driver, uri_template (placeholders
    ``{address} {name} {slot} {index} {chassis}``), credential and group by name, per-host
    cpus / memory_mib / disk_gib (+ optional ratios and reserved amounts), tags.
    A dry run validates everything and returns the preview without writing.
    """
    chassis_fields, rows = _registration_plan(spec)
    reason = f"registration of blade center {chassis_fields['name']}"
    with transaction.atomic():
        chassis = create_blade_center(actor=actor, reason=reason, **chassis_fields)
        dataset = tablib.Dataset(headers=list(rows[0]))
        dataset.extend([list(row.values()) for row in rows])
        report = _run_import(
            dataset,
            actor=actor,
            dry_run=dry_run,
            reason=reason,
            file_name=f"blade center {chassis.name}",
            create_only=True,
        )
        if dry_run or not report.ok:
            transaction.set_rollback(True)
            chassis.pk = None
        else:
            report.committed = True
    hosts = [{"slot": r["slot"], "name": r["name"], "address": r["address"], "uri": r["uri"]} for r in rows]
    return Registration(blade_center=chassis, hosts=hosts, report=report)


def chassis_slots(chassis):
    """[{slot, id, name, state}] for every slot of the chassis (id None: empty)."""
    taken = {hv.slot: hv for hv in chassis.hypervisors.only("id", "name", "state", "slot", "blade_center")}
    return [
        slot_data(taken[slot]) if slot in taken else {"slot": slot, "id": None, "name": None, "state": None}
        for slot in range(1, chassis.slot_count + 1)
    ]
