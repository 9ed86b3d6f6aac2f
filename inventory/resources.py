"""``HypervisorResource``: the one bulk import/export of hypervisors (admin, API, CLI).

django-import-export drives the row loop; this resource makes it fit for thousands of
rows and for the rules of the inventory:

- columns are the model's (see ``COLUMNS``); foreign keys are given by name; an ``id``
  (or an existing ``name``) means update; an unknown column refuses the file;
- names, chassis, groups and credentials are loaded once per import, and name and slot
  uniqueness is checked in memory against the database *and* the earlier rows of the
  file, so each row costs no query;
- rows are written with ``bulk_create``/``bulk_update`` (only the changed fields), tags,
  change-log rows and events in bulk after the last row;
- any rejected row rolls the whole import back (``rollback_on_validation_errors`` is
  forced on), and a dry run writes nothing at all;
- an unchanged row is reported as such and not written: an export imports back as
  "nothing to do".
"""

import math
import re

from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError
from django.db.models import NOT_PROVIDED
from django.utils import timezone
from import_export import fields, resources, widgets
from import_export.results import RowResult
from taggit.models import Tag, TaggedItem

from core import bulk, changelog, events
from inventory import formats
from inventory.models import BladeCenter, Credential, Hypervisor, NodeGroup, cross_field_errors
from inventory.validators import (
    FIRST_SLOT,
    HOST_MINIMUMS,
    INT_MAX,
    RATIO_DEFAULTS,
    RATIO_MAX,
    RATIO_MIN,
    validate_address,
    validate_bmc_address,
    validate_name,
)

COLUMNS = [
    "id", "name", "address", "driver", "uri", "credential", "blade_center", "slot", "group",
    "cpus", "memory_mib", "disk_gib", "cpu_ratio", "memory_ratio", "disk_ratio",
    "reserved_cpus", "reserved_memory_mib", "reserved_disk_gib", "max_vms", "spindles", "overlay",
    "state", "state_reason", "tags",
    "bmc_address", "bmc_credential", "bmc_system", "bmc_verify_tls",
]  # fmt: skip
REQUIRED_FOR_CREATE = ["name", "address", "cpus", "memory_mib", "disk_gib"]
# Model attributes an import may change (tags apart), in the order rows are compared.
ATTRS = [
    "name", "address", "driver", "uri", "credential_id", "blade_center_id", "slot", "group_id",
    "cpus", "memory_mib", "disk_gib", "cpu_ratio", "memory_ratio", "disk_ratio",
    "reserved_cpus", "reserved_memory_mib", "reserved_disk_gib", "max_vms", "spindles", "overlay",
    "state", "state_reason",
    "bmc_address", "bmc_credential_id", "bmc_system", "bmc_verify_tls",
]  # fmt: skip
LOG_NAMES = {
    "credential_id": "credential",
    "blade_center_id": "blade_center",
    "group_id": "group",
    "bmc_credential_id": "bmc_credential",
}
_INT_RE = re.compile(r"^[+-]?\d{1,15}$")


# --- widgets: strict conversions with messages meant for people ------------------------


class TextWidget(widgets.Widget):
    def __init__(self, max_length):
        super().__init__(coerce_to_string=False)
        self.max_length = max_length

    def clean(self, value, row=None, **kwargs):
        if value is None:
            return ""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError("must be text")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        text = str(value).strip()
        if len(text) > self.max_length:
            raise ValueError(f"at most {self.max_length} characters")
        return text

    def render(self, value, obj=None, **kwargs):
        return value or ""


class IntWidget(widgets.Widget):
    def __init__(self, minimum=0):
        super().__init__(coerce_to_string=False)
        self.minimum = minimum

    @property
    def message(self):
        return "must be a positive integer" if self.minimum >= 1 else "must be a whole number, 0 or more"

    def clean(self, value, row=None, **kwargs):
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, bool):
            raise ValueError(self.message)
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(self.message)
            value = int(value)
        elif isinstance(value, str):
            if not _INT_RE.match(value.strip()):
                raise ValueError(self.message)
            value = int(value.strip())
        elif not isinstance(value, int):
            raise ValueError(self.message)
        if value < self.minimum:
            raise ValueError(self.message)
        if value > INT_MAX:
            raise ValueError(f"must be at most {INT_MAX}")
        return value

    def render(self, value, obj=None, **kwargs):
        return value


class RatioWidget(widgets.Widget):
    MESSAGE = f"must be a number between {RATIO_MIN:g} and {RATIO_MAX:g}"

    def __init__(self):
        super().__init__(coerce_to_string=False)

    def clean(self, value, row=None, **kwargs):
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, bool):
            raise ValueError(self.MESSAGE)
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise ValueError(self.MESSAGE) from None
        if not math.isfinite(number) or not RATIO_MIN <= number <= RATIO_MAX:
            raise ValueError(self.MESSAGE)
        return number

    def render(self, value, obj=None, **kwargs):
        return value


class ChoiceWidget(widgets.Widget):
    def __init__(self, choices, label):
        super().__init__(coerce_to_string=False)
        self.values = [value for value, _ in choices]
        self.label = label

    def clean(self, value, row=None, **kwargs):
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        text = str(value).strip().lower()
        if text not in self.values:
            allowed = ", ".join(self.values[:-1]) + f" or {self.values[-1]}"
            raise ValueError(f"unknown {self.label} {str(value)[:50]!r} (use {allowed})")
        return text

    def render(self, value, obj=None, **kwargs):
        return value or ""


class BoolWidget(ChoiceWidget):
    """true/false (also yes/no, 1/0); blank: the column's default."""

    WORDS = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}

    def __init__(self, label):
        super().__init__([(word, word) for word in self.WORDS], label)

    def clean(self, value, row=None, **kwargs):
        if isinstance(value, bool):
            return value
        text = super().clean(value, row, **kwargs)
        return None if text is None else self.WORDS[text]

    def render(self, value, obj=None, **kwargs):
        return "true" if value else "false"


class NameWidget(widgets.Widget):
    """A foreign key by name, looked up in a dict the resource fills once per import."""

    def __init__(self, model, label):
        super().__init__(coerce_to_string=False)
        self.model = model
        self.label = label
        self.by_name = None

    def load(self):
        self.by_name = {obj.name: obj for obj in self.model.objects.all()}

    def clean(self, value, row=None, **kwargs):
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if self.by_name is None:
            self.load()
        name = str(value).strip()
        found = self.by_name.get(name)
        if found is None:
            near = [n for n in self.by_name if n.lower() == name.lower()]
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"no {self.label} named {name[:100]!r}{hint}")
        return found

    def render(self, value, obj=None, **kwargs):
        return value.name if value is not None else ""


class TagsWidget(widgets.Widget):
    """Comma-separated names in a cell ('gpu, ssd'), or a list in JSON/YAML."""

    def __init__(self):
        super().__init__(coerce_to_string=False)

    def clean(self, value, row=None, **kwargs):
        if value is None:
            return []
        if isinstance(value, str):
            items = value.split(",")
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            items = value
        else:
            raise ValueError("must be comma-separated tag names")
        tags = sorted({item.strip() for item in items if item.strip()})
        for tag in tags:
            if len(tag) > 100:
                raise ValueError(f"tag {tag[:20]!r}… is longer than 100 characters")
        return tags

    def render(self, value, obj=None, **kwargs):
        return ", ".join(value or [])


class TagsField(fields.Field):
    """Tags are kept on the instance (``_import_tags``) and written in bulk after the rows."""

    def save(self, instance, row, is_m2m=False, **kwargs):
        instance._import_tags = self.clean(row, **kwargs)

    def get_value(self, instance):
        return getattr(instance, "_import_tags", None)


def _field(name, widget, default=fields.NOT_PROVIDED, readonly=False):
    return fields.Field(attribute=name, column_name=name, widget=widget, default=default, readonly=readonly)


def amount_widget(name):
    """The widget for a host amount: a ratio within its bounds, or a whole number from its minimum."""
    return RatioWidget() if name in RATIO_DEFAULTS else IntWidget(minimum=HOST_MINIMUMS[name])


def amount_default(name):
    """What a host amount is when not given (the model's default), or None when it has none."""
    default = Hypervisor._meta.get_field(name).default
    return None if default is NOT_PROVIDED else default


def _amount(name):
    default = amount_default(name)
    return _field(name, amount_widget(name), default=fields.NOT_PROVIDED if default is None else default)


class HypervisorResource(resources.ModelResource):
    id = _field("id", IntWidget(minimum=1), readonly=True)
    name = _field("name", TextWidget(100))
    address = _field("address", TextWidget(253))
    driver = _field("driver", ChoiceWidget(Hypervisor.Driver.choices, "driver"), default=Hypervisor.Driver.SIM)
    uri = _field("uri", TextWidget(500))
    credential = _field("credential", NameWidget(Credential, "credential"))
    blade_center = _field("blade_center", NameWidget(BladeCenter, "blade center"))
    slot = _field("slot", IntWidget(minimum=FIRST_SLOT))
    group = _field("group", NameWidget(NodeGroup, "node group"))
    cpus = _amount("cpus")
    memory_mib = _amount("memory_mib")
    disk_gib = _amount("disk_gib")
    cpu_ratio = _amount("cpu_ratio")
    memory_ratio = _amount("memory_ratio")
    disk_ratio = _amount("disk_ratio")
    reserved_cpus = _amount("reserved_cpus")
    reserved_memory_mib = _amount("reserved_memory_mib")
    reserved_disk_gib = _amount("reserved_disk_gib")
    max_vms = _amount("max_vms")
    spindles = _amount("spindles")
    overlay = _field("overlay", TextWidget(100))
    state = _field("state", ChoiceWidget(Hypervisor.State.choices, "state"), default=Hypervisor.State.ONLINE)
    state_reason = _field("state_reason", TextWidget(500))
    tags = TagsField(attribute="tags", column_name="tags", widget=TagsWidget())
    bmc_address = _field("bmc_address", TextWidget(500))
    bmc_credential = _field("bmc_credential", NameWidget(Credential, "credential"))
    bmc_system = _field("bmc_system", TextWidget(300))
    bmc_verify_tls = _field("bmc_verify_tls", BoolWidget("bmc_verify_tls value"), default=True)

    class Meta:
        model = Hypervisor
        fields = COLUMNS
        import_order = COLUMNS
        export_order = COLUMNS
        import_id_fields = ["id"]
        use_bulk = True
        batch_size = 1000
        skip_diff = True
        report_skipped = True
        use_transactions = True
        clean_model_instances = False  # validate_instance() does it, without per-row queries

    # --- import: set up ------------------------------------------------------------

    def import_data(
        self,
        dataset,
        dry_run=False,
        raise_errors=False,
        use_transactions=None,
        collect_failed_rows=False,
        rollback_on_validation_errors=False,
        **kwargs,
    ):
        problem = header_problem(dataset.headers)
        if problem:
            result = self.get_result_class()()
            result.total_rows = len(dataset)
            result.append_base_error(self.get_error_result_class()(formats.FileError(problem)))
            return result
        if dry_run:
            # A dry run writes nothing (bulk writes are skipped), so it needs no transaction:
            # on SQLite an (IMMEDIATE) transaction would hold other writers off while it runs.
            return self.import_data_inner(dataset, True, raise_errors, False, collect_failed_rows, **kwargs)
        # One bad row, nothing written: whoever calls (the admin included).
        return super().import_data(
            dataset,
            dry_run=dry_run,
            raise_errors=raise_errors,
            use_transactions=True,
            collect_failed_rows=collect_failed_rows,
            rollback_on_validation_errors=True,
            **kwargs,
        )

    def before_import(self, dataset, **kwargs):
        for name in ("credential", "blade_center", "group", "bmc_credential"):
            self.fields[name].widget.load()
        self.chassis_by_id = {c.pk: c for c in self.fields["blade_center"].widget.by_name.values()}
        self.columns = set(dataset.headers)
        self.wanted_ids, self.wanted_names = self._keys_in(dataset)
        self.existing = {}  # id → instance, only for rows of this file
        self.names = {}  # lower(name) → (id or None, row number or None, name)
        self.slots = {}  # (chassis id, slot) → (id or None, name, row number or None)
        for pk, name, chassis, slot in Hypervisor.objects.values_list("id", "name", "blade_center_id", "slot"):
            self.names[name.lower()] = (pk, None, name)
            if chassis is not None:
                self.slots[(chassis, slot)] = (pk, name, None)
        self._load_existing()
        self.seen_ids = {}
        self.create_only = bool(kwargs.get("create_only"))
        self.created, self.updated = [], []
        self.failed = False
        self.row_number = 0

    def _keys_in(self, dataset):
        ids, names = set(), set()
        headers = dataset.headers
        id_index = headers.index("id") if "id" in headers else None
        name_index = headers.index("name") if "name" in headers else None
        for row in dataset:
            if id_index is not None and row[id_index] not in (None, ""):
                try:
                    ids.add(IntWidget(1).clean(row[id_index]))
                except ValueError:
                    pass
            if name_index is not None and isinstance(row[name_index], str):
                names.add(row[name_index].strip())
        return ids, names

    def _load_existing(self):
        ids, names = list(self.wanted_ids), list(self.wanted_names)
        found = []
        for chunk in range(0, max(len(ids), len(names)), 500):
            query = Hypervisor.objects.filter(id__in=ids[chunk : chunk + 500]) | Hypervisor.objects.filter(
                name__in=names[chunk : chunk + 500]
            )
            found.extend(query.select_related("credential", "blade_center", "group", "bmc_credential"))
        self.existing = {hv.pk: hv for hv in found}
        self.existing_by_name = {hv.name: hv for hv in found}
        self.tags_before = _tags_of(list(self.existing))
        for hv in found:
            hv._tags_before = self.tags_before.get(hv.pk, [])
            hv._import_tags = list(hv._tags_before)

    # --- import: per row -------------------------------------------------------------

    def get_import_fields(self):
        # The library recomputes this list for every row; it never changes.
        if getattr(self, "_import_fields", None) is None:
            self._import_fields = super().get_import_fields()
        return self._import_fields

    def import_instance(self, instance, row, **kwargs):
        errors = {}
        for field in self.get_import_fields():
            if field.readonly or field.column_name not in row:
                continue
            try:
                field.save(instance, row)
            except ValueError as exc:
                errors[field.attribute] = ValidationError(str(exc), code="invalid")
        if errors:
            raise ValidationError(errors)

    def before_import_row(self, row, **kwargs):
        self.row_number = kwargs.get("row_number", self.row_number + 1)

    def get_instance(self, instance_loader, row):
        raw_id = row.get("id")
        if raw_id not in (None, ""):
            try:
                pk = IntWidget(1).clean(raw_id)
            except ValueError:
                raise ValidationError({"id": "must be the id of an existing hypervisor (a positive integer)"}) from None
            instance = self.existing.get(pk)
            if instance is None:
                raise ValidationError({"id": f"no hypervisor has id {pk}"})
        else:
            name = row.get("name")
            instance = self.existing_by_name.get(name.strip()) if isinstance(name, str) else None
            if instance is None:
                return None
        if self.create_only:
            raise ValidationError({"name": f"a hypervisor named {instance.name!r} already exists (id {instance.pk})"})
        earlier = self.seen_ids.get(instance.pk)
        if earlier is not None:
            raise ValidationError({"name": f"{instance.name!r} already appears in row {earlier}"})
        self.seen_ids[instance.pk] = self.row_number
        return instance

    def after_init_instance(self, instance, new, row, **kwargs):
        self.current = instance
        instance._before = None if new else _snapshot(instance)
        if new:
            instance._import_tags = []

    def skip_row(self, instance, original, row, import_validation_errors=None):
        if import_validation_errors or instance._before is None:
            return False
        return _snapshot(instance) == instance._before

    def validate_instance(self, instance, import_validation_errors=None, validate_unique=True):
        errors = {key: _messages(value) for key, value in (import_validation_errors or {}).items()}
        for attr in REQUIRED_FOR_CREATE:
            if attr not in errors and getattr(instance, attr) in (None, ""):
                errors[attr] = ["required" if attr in self.columns else f"required: add a {attr!r} column"]
        checks = (("name", validate_name), ("address", validate_address), ("bmc_address", validate_bmc_address))
        for attr, check in checks:
            if attr not in errors:
                try:
                    check(getattr(instance, attr))
                except ValidationError as exc:
                    errors[attr] = exc.messages
        if not errors.keys() & {"driver", "uri", "blade_center", "slot", "cpus", "memory_mib", "disk_gib"}:
            chassis = self.chassis_by_id.get(instance.blade_center_id)
            for attr, message in cross_field_errors(instance, chassis).items():
                errors.setdefault(attr, [message])
        self._check_unique(instance, errors)
        if errors:
            raise ValidationError(errors)

    def _check_unique(self, instance, errors):
        if "name" not in errors:
            key = instance.name.lower()
            holder = self.names.get(key)  # (id, row number, exact name)
            if holder is None or (holder[0] is not None and holder[0] == instance.pk):
                self.names[key] = (instance.pk, self.row_number, instance.name)
            elif holder[1] is not None:
                errors["name"] = [f"{instance.name!r} already appears in row {holder[1]}"]
            else:
                case = f" as {holder[2]!r} (names ignore case)" if holder[2] != instance.name else ""
                errors["name"] = [f"a hypervisor with this name already exists{case}, id {holder[0]}"]
        if "slot" not in errors and "blade_center" not in errors and instance.blade_center_id is not None:
            key = (instance.blade_center_id, instance.slot)
            holder = self.slots.get(key)  # (id, name, row number)
            if holder is None or (holder[0] is not None and holder[0] == instance.pk):
                self.slots[key] = (instance.pk, instance.name, self.row_number)
            else:
                pk, name, row = holder
                where = f"row {row} ({name})" if row is not None else name
                chassis = self.chassis_by_id[instance.blade_center_id].name
                errors["slot"] = [f"slot {instance.slot} of {chassis} is already taken by {where}"]

    def after_import_row(self, row, row_result, **kwargs):
        if row_result.validation_error is not None or row_result.errors:
            self.failed = True
        elif kwargs.get("preview_cells"):
            row_result.diff = self._preview_cells(self.current)

    def _preview_cells(self, instance):
        """The admin's preview: each column's value, 'old → new' where an update changes it."""
        before = instance._before
        cells = []
        for field in self.get_import_fields():
            new = field.export(instance) if field.column_name != "tags" else ", ".join(instance._import_tags)
            if before is not None and field.column_name in self.columns and field.column_name != "id":
                attr = field.column_name + ("_id" if field.column_name in LOG_NAMES.values() else "")
                old = before["tags"] if attr == "tags" else before.get(attr)
                if attr in LOG_NAMES:
                    old_obj = self.fields[field.column_name].widget.by_name
                    old = next((o.name for o in old_obj.values() if o.pk == old), "")
                elif attr == "tags":
                    old = ", ".join(old)
                if (old if old is not None else "") != (new if new is not None else ""):
                    new = f"{'' if old is None else old} → {new}"
            cells.append("" if new is None else str(new))
        return cells

    def save_instance(self, instance, is_create, row, **kwargs):
        if not is_create:
            instance.updated = timezone.now()
        if instance.state != (instance._before or {}).get("state", Hypervisor.State.ONLINE):
            instance.state_changed_at = timezone.now()
            instance.state_changed_by = self._actor(kwargs).label[:150]
        (self.created if is_create else self.updated).append(instance)
        super().save_instance(instance, is_create, row, **kwargs)

    # --- import: writing in bulk ----------------------------------------------------

    def bulk_create(self, using_transactions, dry_run, raise_errors, batch_size=None, result=None):
        def write():
            bulk.insert_instances(Hypervisor, self.create_instances)
            names = [hv.name for hv in self.create_instances]
            ids = {}
            for start in range(0, len(names), 500):
                ids.update(Hypervisor.objects.filter(name__in=names[start : start + 500]).values_list("name", "id"))
            for hv in self.create_instances:
                hv.pk = ids[hv.name]
                hv._state.adding = False

        self._write_bulk(self.create_instances, write, dry_run, raise_errors, result)

    def bulk_update(self, using_transactions, dry_run, raise_errors, batch_size=None, result=None):
        def write():
            changed = {"updated"}
            for instance in self.update_instances:
                changed.update(_changed(instance))
                if "state" in changed:
                    changed.update({"state_changed_at", "state_changed_by"})
            bulk.update_instances(Hypervisor, self.update_instances, sorted(changed))

        self._write_bulk(self.update_instances, write, dry_run, raise_errors, result)

    def _write_bulk(self, instances, write, dry_run, raise_errors, result):
        """``write()`` the pending ``instances`` (then forget them), unless this is a dry run, a
        row failed or there are none; an error becomes the import's (a lost race said so)."""
        try:
            if instances and not (dry_run or self.failed):
                write()
        except IntegrityError as exc:
            self.handle_import_error(result, _concurrent(exc), raise_errors)
        except Exception as exc:
            self.handle_import_error(result, exc, raise_errors)
        finally:
            instances.clear()

    def after_import(self, dataset, result, **kwargs):
        if kwargs.get("dry_run") or self.failed or result.has_errors() or result.has_validation_errors():
            return
        tagged = [hv for hv in self.created + self.updated if hv._import_tags != getattr(hv, "_tags_before", [])]
        _write_tags(tagged)
        actor = self._actor(kwargs)
        reason = kwargs.get("reason") or f"import of {kwargs.get('file_name') or 'a file'}"
        names_by_id = {
            attr: {obj.pk: obj.name for obj in self.fields[field].widget.by_name.values()}
            for attr, field in LOG_NAMES.items()
        }
        _log_changes(self.created, self.updated, actor, reason, names_by_id)
        _emit_import_events(self.created, self.updated, actor, kwargs.get("file_name") or "")

    def _actor(self, kwargs):
        if kwargs.get("actor") is not None:
            return changelog.Actor.of(kwargs["actor"])
        return changelog.Actor.of(kwargs.get("user"))

    # --- export ---------------------------------------------------------------------

    def get_queryset(self):
        related = ("credential", "blade_center", "group", "bmc_credential")
        return Hypervisor.objects.select_related(*related).order_by("name")

    def export(self, queryset=None, **kwargs):
        queryset = self.get_queryset() if queryset is None else queryset
        queryset = queryset.select_related("credential", "blade_center", "group", "bmc_credential")
        self.export_tags = _tags_of(list(queryset.values_list("id", flat=True)))
        return super().export(queryset.prefetch_related(None), **kwargs)

    def export_resource(self, instance, selected_fields=None, **kwargs):
        # The library looks up each field's name and dehydrate method for every cell.
        getters = getattr(self, "_export_getters", None)
        if getters is None or getters[0] != selected_fields:
            fields = self.get_export_fields(selected_fields)
            getters = (
                selected_fields,
                [getattr(self, f"dehydrate_{self.get_field_name(f)}", None) or f.export for f in fields],
            )
            self._export_getters = getters
        return [getter(instance) for getter in getters[1]]

    def dehydrate_tags(self, instance):
        export_tags = getattr(self, "export_tags", None)
        if export_tags is None:  # exporting a single instance, outside export()
            return ", ".join(sorted(t.name for t in instance.tags.all()))
        return ", ".join(export_tags.get(instance.pk, []))


# --- helpers ---------------------------------------------------------------------------


def _concurrent(exc):
    return formats.FileError(
        f"the database refused the rows ({exc}); did someone change these hosts meanwhile? Try again"
    )


def header_problem(headers):
    """Why a file with these column names cannot be imported, or None."""
    headers = list(headers or [])
    unknown = [h for h in headers if h not in COLUMNS]
    if unknown:
        return f"unknown column {unknown[0]!r} (the columns are: {', '.join(COLUMNS)})"
    if "id" not in headers and "name" not in headers:
        return "the file needs a 'name' column (or 'id' to update hypervisors by id)"
    return None


def _snapshot(instance):
    return {**{attr: getattr(instance, attr) for attr in ATTRS}, "tags": list(getattr(instance, "_import_tags", []))}


def _changed(instance):
    before = instance._before or {}
    return [
        attr.removesuffix("_id") if attr in LOG_NAMES else attr
        for attr in ATTRS
        if before.get(attr) != getattr(instance, attr)
    ]


def _messages(error):
    if isinstance(error, ValidationError):
        return error.messages
    if isinstance(error, (list, tuple)):
        return [m for item in error for m in _messages(item)]
    return [str(error)]


def _tags_of(ids):
    """{hypervisor id: sorted tag names} in one query per 500 ids."""
    content_type = ContentType.objects.get_for_model(Hypervisor)
    tags = {}
    for start in range(0, len(ids), 500):
        rows = TaggedItem.objects.filter(content_type=content_type, object_id__in=ids[start : start + 500])
        for object_id, name in rows.values_list("object_id", "tag__name"):
            tags.setdefault(object_id, []).append(name)
    return {pk: sorted(names) for pk, names in tags.items()}


def _write_tags(instances):
    """Set each instance's tags to ``_import_tags`` with a handful of queries in all."""
    if not instances:
        return
    content_type = ContentType.objects.get_for_model(Hypervisor)
    wanted = {name for hv in instances for name in hv._import_tags}
    by_name = {tag.name: tag for tag in Tag.objects.filter(name__in=wanted)}
    for name in sorted(wanted - by_name.keys()):
        by_name[name] = Tag.objects.create(name=name)  # Tag.save() makes a unique slug
    ids = [hv.pk for hv in instances]
    for start in range(0, len(ids), 500):
        TaggedItem.objects.filter(content_type=content_type, object_id__in=ids[start : start + 500]).delete()
    bulk.insert_rows(
        TaggedItem,
        ["content_type", "object_id", "tag"],
        [(content_type.pk, hv.pk, by_name[name].pk) for hv in instances for name in hv._import_tags],
    )


def _value_for_log(instance, attr):
    if attr in LOG_NAMES:
        related = getattr(instance, LOG_NAMES[attr])
        return related.name if related is not None else None
    return getattr(instance, attr)


def _log_changes(created, updated, actor, reason, names_by_id):
    """One change-log row per created or updated host, as the single-host services write them."""
    entries = [(hv, "create", _created_changes(hv)) for hv in created]
    for hv in updated:
        changes = _updated_changes(hv, names_by_id)
        action = "state" if list(changes) in (["state"], ["state", "state_reason"]) else "update"
        entries.append((hv, action, changes))
    changelog.record_many(entries, actor=actor, reason=reason)


def _log_name(attr):
    return LOG_NAMES.get(attr, attr)


def _created_changes(hv):
    changes = {_log_name(a): [None, value] for a in ATTRS if (value := _value_for_log(hv, a)) not in (None, "")}
    if hv._import_tags:
        changes["tags"] = [[], hv._import_tags]
    return changes


def _updated_changes(hv, names_by_id):
    before = hv._before
    changes = {}
    for attr in ATTRS:
        if before[attr] != getattr(hv, attr):
            old = before[attr]
            if attr in LOG_NAMES and old is not None:
                old = names_by_id[attr].get(old, old)
            changes[_log_name(attr)] = [old, _value_for_log(hv, attr)]
    if hv._import_tags != hv._tags_before:
        changes["tags"] = [hv._tags_before, hv._import_tags]
    return changes


def _emit_import_events(created, updated, actor, file_name):
    """Per updated host an event on its own topic, per chassis one with its slots, one for admin.

    Outbox rows written in bulk (``events.emit_many``), so an import of thousands of hosts
    adds a few hundred rows, not thousands of round trips.
    """
    items = []
    slots_by_chassis = {}
    for hv in updated:
        before = hv._before
        kind = "hypervisor.state" if before["state"] != hv.state else "hypervisor.changed"
        items.append((kind, host_data(hv, action="updated"), [f"hypervisor.{hv.pk}"]))
        if before["blade_center_id"] is not None and (before["blade_center_id"], before["slot"]) != (
            hv.blade_center_id,
            hv.slot,
        ):
            slots_by_chassis.setdefault(before["blade_center_id"], []).append(
                {"slot": before["slot"], "id": None, "name": None, "state": None}
            )
    for hv in created + updated:
        if hv.blade_center_id is not None:
            slots_by_chassis.setdefault(hv.blade_center_id, []).append(slot_data(hv))
    for chassis_id, slots in slots_by_chassis.items():
        items.append(("bladecenter.slots", {"blade_center": chassis_id, "slots": slots}, [f"bladecenter.{chassis_id}"]))
    items.append(
        (
            "hypervisor.imported",
            {
                "created": len(created),
                "updated": len(updated),
                "by": actor.label,
                "file": file_name[:200],
            },
            ["admin"],
        )
    )
    events.emit_many(items, rows=False)


def slot_data(hv):
    return {"slot": hv.slot, "id": hv.pk, "name": hv.name, "state": hv.state}


def host_data(hv, **extra):
    data = {
        "id": hv.pk,
        "name": hv.name,
        "state": hv.state,
        "state_reason": hv.state_reason,
        "blade_center": hv.blade_center_id,
        "slot": hv.slot,
        "slots": [slot_data(hv)] if hv.blade_center_id else [],
    }
    data.update(extra)
    return data


def row_messages(number, row_result):
    """'Row 12 memory_mib: must be a positive integer' lines for one rejected row."""
    if row_result.validation_error is not None:
        lines = []
        for field, messages in row_result.validation_error.message_dict.items():
            prefix = f"Row {number}" if field == NON_FIELD_ERRORS else f"Row {number} {field}"
            lines.extend(f"{prefix}: {message}" for message in messages)
        return lines
    return [f"Row {number}: {error.error}" for error in row_result.errors]


IMPORT_ACTIONS = {
    RowResult.IMPORT_TYPE_NEW: "create",
    RowResult.IMPORT_TYPE_UPDATE: "update",
    RowResult.IMPORT_TYPE_SKIP: "unchanged",
    RowResult.IMPORT_TYPE_INVALID: "reject",
    RowResult.IMPORT_TYPE_ERROR: "reject",
}
