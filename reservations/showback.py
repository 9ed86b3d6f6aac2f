"""Showback: what every kind of use held, per user, class, group and image, with its cost.

Contract: a *use* is one machine held for someone over ``[start, end)``:

- a reservation from when its machine was ready to when it stopped (``usage``'s rule, the same
  intervals); a seat of a class session (a reservation of the one-week block a
  ``classes.Meeting`` holds) is kind ``class`` and carries the class, any other one
  ``reservation``;
- a batch run from its command's start to its end (now while it runs), less the time it spent
  suspended (taken off its end), and an ad-hoc VM for its claim: the uses of
  ``provisioning.usage.SOURCES`` (filled by the provisioning and runs apps).

Each use is split at UTC midnights and summed per (day, kind, user, image, group, class):
seconds, vCPU-seconds, MiB-seconds (memory), GPU-seconds, and uses started that day. The group
is the block's, else the user's first (``usage``'s rule). ``compute`` does that from the
history; ``rollup.aggregate`` stores it as ``UsageRollup`` rows with the day's ``UsageDay``
rows (one transaction), with a mark row per day stored; ``report`` sums the stored days in SQL
(whole months from their month rows) and computes the others (today) live.

Who sees what is decided in one place, ``visible_usage(user)``: administrators and auditors
(``see_all``) everything; an instructor the seats of the classes they teach (``TAUGHT_CLASSES``,
filled by the classes app) and their own use; anyone else their own use.

Prices (``USAGE_PRICES``, per hour, per vCPU-hour, per GiB-hour, per GPU-hour, in
``USAGE_CURRENCY``) give a cost column; without prices there is none (``cost`` is None).
"""

import io
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, timedelta

from django.conf import settings
from django.db.models import Max, Q, Sum
from django.utils import timezone

from accounts import access
from core import spreadsheets
from core.bulk import insert_rows
from core.hooks import Hook
from provisioning import usage as usage_sources
from provisioning.usage import Use
from reservations import usage
from reservations.models import UsageRollup

K = UsageRollup.Kind
SPAN = UsageRollup.Span
GROUPINGS = ("user", "class", "group", "image")
MEASURES = ("seconds", "vcpu_seconds", "mib_seconds", "gpu_seconds", "uses")
_FIELDS = ("kind", "user_id", "username", "image", "group", "class_id", "class_name")  # a row's key
_COLUMNS = ("kind", "user", "username", "image", "group", "class_id", "class_name")  # the same, as fields
PRICE_UNITS = ("hour", "vcpu_hour", "gib_hour", "gpu_hour")


# Filled by the classes app (its ``ready()``):
# the class each of some blocks' seats belong to, ``{block_id: (class_id, class_name)}`` (classes);
CLASS_OF_BLOCKS: Hook[Callable[[set], dict]] = Hook("reservations.showback.CLASS_OF_BLOCKS", single=True)
# the ids of the classes a user teaches (classes);
TAUGHT_CLASSES: Hook[Callable[[object], set]] = Hook("reservations.showback.TAUGHT_CLASSES", single=True)
# the hours budget of some classes, ``{class_id: hours}``, those that have one (classes);
CLASS_BUDGETS: Hook[Callable[[set], dict]] = Hook("reservations.showback.CLASS_BUDGETS", single=True)
# where the hours budget of one class stands for some users over its whole term, now,
# ``{user_id: {"budget", "extra", "used", "left"}}`` in hours, those it binds (classes).
STUDENT_BUDGETS: Hook[Callable[[int, set], dict]] = Hook("reservations.showback.STUDENT_BUDGETS", single=True)

#: A row's budget fields: the class's hours (per class and per student); per student, also the
#: extra hours granted, the hours used outside sessions over the term and the hours left.
BUDGET_FIELDS = ("budget_hours", "budget_extra_hours", "budget_used_hours", "budget_left_hours")


# --- the uses --------------------------------------------------------------------------------


def _reservation_uses(intervals):
    classes = {}
    blocks = {size[4] for *_, size in intervals if size[4] is not None}
    if blocks and CLASS_OF_BLOCKS.one():
        classes = CLASS_OF_BLOCKS.one()(blocks)
    for image, group, used_from, used_to, _, _, (user_id, vcpus, memory_mib, gpus, block_id) in intervals:
        klass = classes.get(block_id)
        yield Use(
            K.CLASS if klass else K.RESERVATION,
            user_id,
            image,
            used_from,
            used_to,
            vcpus,
            memory_mib,
            gpus,
            group=group,
            class_id=klass[0] if klass else None,
            class_name=klass[1] if klass else "",
        )


def uses(t0, t1, now, intervals=None):
    """Every use that overlaps ``[t0, t1)``; ``intervals``: ``usage._intervals`` already read."""
    intervals = usage._intervals(t0, t1, now) if intervals is None else intervals
    yield from _reservation_uses(intervals)
    for source in usage_sources.SOURCES:  # ad-hoc VMs, batch runs
        yield from source(t0, t1, now)


# --- per day -------------------------------------------------------------------------------------


def _names(model, ids, field):
    return dict(model.objects.filter(pk__in=ids).values_list("pk", field)) if ids else {}


def compute(first, last, now=None, intervals=None):
    """``{day: {(kind, user_id, username, image, group, class_id, class_name): [measures]}}``
    for the UTC days ``first..last``; measures in ``MEASURES`` order."""
    from django.contrib.auth import get_user_model

    now = now or timezone.now()
    t0, t1 = usage.day_start(first), usage.day_start(last + timedelta(days=1))
    found = [u for u in uses(t0, t1, now, intervals) if u.end > u.start and u.start < t1 and u.end > t0]
    user_ids = {u.user_id for u in found if u.user_id is not None}
    groups = usage._user_groups({u.user_id for u in found if u.group is None and u.user_id is not None})
    names = _names(get_user_model(), user_ids, "username")
    out = {day: defaultdict(lambda: [0, 0, 0, 0, 0]) for day in usage._days(first, last)}
    for u in found:
        group = u.group if u.group is not None else groups.get(u.user_id, "")
        key = (u.kind, u.user_id, names.get(u.user_id, ""), u.image, group, u.class_id, u.class_name)
        if t0 <= u.start < t1:
            out[u.start.astimezone(UTC).date()][key][4] += 1
        day = max(first, u.start.astimezone(UTC).date())
        while day <= last and usage.day_start(day) < u.end:
            a, b = max(u.start, usage.day_start(day)), min(u.end, usage.day_start(day + timedelta(days=1)))
            if b > a:
                seconds = round((b - a).total_seconds())
                cell = out[day][key]
                cell[0] += seconds
                cell[1] += seconds * u.vcpus
                cell[2] += seconds * u.memory_mib
                cell[3] += seconds * u.gpus
            day += timedelta(days=1)
    return out


def store(computed):
    """Insert ``compute``'s answer as day rows (the caller deleted what they replace), one
    statement per batch (``core.bulk``: a year's backfill writes hundreds of thousands)."""
    rows = [(SPAN.DAY, day, *key, *cell) for day, cells in computed.items() for key, cell in cells.items()]
    marks = [(SPAN.MARK, day, "", None, "", "", "", None, "", 0, 0, 0, 0, 0) for day in computed]
    insert_rows(UsageRollup, ("span", "day", *_COLUMNS, *MEASURES), rows + marks)


def stored_days(first, last):
    """The days of ``first..last`` whose figures are stored (they have their mark row)."""
    marks = UsageRollup.objects.filter(span=SPAN.MARK, day__range=(first, last))
    return set(marks.values_list("day", flat=True))


def _month_end(month):
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1) - timedelta(days=1)


def roll_months(first, last):
    """Rebuild the month rows of the months that ``first..last`` touches from their stored day
    rows (``rollup.aggregate`` calls it in its transaction, after storing those days)."""
    months = sorted({day.replace(day=1) for day in usage._days(first, last)})
    UsageRollup.objects.filter(span=SPAN.MONTH, day__in=months).delete()
    for month in months:
        days = UsageRollup.objects.filter(span=SPAN.DAY, day__range=(month, _month_end(month))).order_by()
        sums = days.values_list(*_FIELDS).annotate(*(Sum(m) for m in MEASURES))
        insert_rows(UsageRollup, ("span", "day", *_COLUMNS, *MEASURES), [(SPAN.MONTH, month, *row) for row in sums])


def _stored_rows(first, last, stored):
    """The rollup rows that cover the stored days of ``first..last`` once: a month's row for each
    whole month in range with every day stored, the day rows for the other stored days."""
    whole = []
    month = first.replace(day=1)
    while month <= last:
        end = _month_end(month)
        if month >= first and end <= last and all(d in stored for d in usage._days(month, end)):
            whole.append(month)
        month = end + timedelta(days=1)
    in_whole = {d for m in whole for d in usage._days(m, _month_end(m))}
    runs = usage._runs([d for d in stored if d not in in_whole])
    by_day = Q(pk__in=())
    for run in runs:
        by_day |= Q(day__range=(run[0], run[-1]))
    return UsageRollup.objects.filter(Q(span=SPAN.MONTH, day__in=whole) | (Q(span=SPAN.DAY) & by_day))


# --- who sees what --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """The uses a viewer may see: all, or their own and the seats of some classes."""

    everything: bool = False
    user_id: int | None = None
    class_ids: frozenset = frozenset()

    def q(self):
        if self.everything:
            return Q()
        return Q(user_id=self.user_id) | Q(class_id__in=self.class_ids) if self.user_id else Q(pk__in=())

    def admits(self, user_id, class_id):
        return self.everything or (self.user_id is not None and user_id == self.user_id) or class_id in self.class_ids

    @property
    def teaches(self):
        return self.everything or bool(self.class_ids)


def visible_usage(user):
    """The one rule of who sees whose usage (page, CSV and API alike)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Scope()
    if access.can(user, "see_all"):
        return Scope(everything=True)
    taught = TAUGHT_CLASSES.one()(user) if TAUGHT_CLASSES.one() else set()
    return Scope(user_id=user.pk, class_ids=frozenset(taught))


# --- the report ------------------------------------------------------------------------------------

_KEYS = {  # grouping -> (key column, label column) in the rollup
    "user": ("user_id", "username"),
    "class": ("class_id", "class_name"),
    "group": ("group", "group"),
    "image": ("image", "image"),
}


def prices():
    """The unit prices set (``USAGE_PRICES``), or None: no cost column."""
    set_ = {unit: float(p) for unit, p in (getattr(settings, "USAGE_PRICES", None) or {}).items()}
    return set_ or None


def _measures(total, price):
    hours = {
        "hours": total[0] / 3600,
        "vcpu_hours": total[1] / 3600,
        "gib_hours": total[2] / 1024 / 3600,
        "gpu_hours": total[3] / 3600,
    }
    cost = None
    if price is not None:
        cost = round(sum(hours[unit + "s"] * price.get(unit, 0) for unit in PRICE_UNITS), 2)
    return {**{k: round(v, 3) for k, v in hours.items()}, "uses": total[4], "cost": cost}


def _filtered(found, filters):
    q = Q()
    for name in ("image", "group", "kind", "class_id"):
        if filters.get(name) is not None:
            q &= Q(**{name: filters[name]})
    return found.filter(q)


def _admitted(key, filters, scope):
    kind, user_id, _, image, group, class_id, _ = key
    if not scope.admits(user_id, class_id):
        return False
    values = {"kind": kind, "image": image, "group": group, "class_id": class_id}
    return all(filters.get(name) is None or values[name] == filters[name] for name in values)


def report(first, last, *, by="user", scope, filters=None, now=None, stored=True):
    """Usage of the UTC days ``first..last`` grouped ``by`` one of ``GROUPINGS``, as ``scope``
    may see it; ``filters``: ``image``, ``group``, ``kind``, ``class_id`` (None: any)."""
    if by not in GROUPINGS:
        raise ValueError(f"by: one of {', '.join(GROUPINGS)}")
    filters = filters or {}
    totals, labels, kinds = _sums(first, last, by, scope, filters, now or timezone.now(), stored)
    price = prices()
    budgets, standings = _budgets(by, filters, totals)
    rows = []
    for key in sorted(totals, key=lambda k: (-totals[k][0], str(labels.get(k) or ""), str(k))):
        row = {"key": "" if key is None else str(key), "label": _label(by, key, labels.get(key))}
        rows.append({**row, **_measures(totals[key], price), **dict.fromkeys(BUDGET_FIELDS), **budgets.get(key, {})})
    return {
        "from": first.isoformat(),
        "to": last.isoformat(),
        "by": by,
        "filters": {
            "image": filters.get("image"),
            "group": filters.get("group"),
            "kind": filters.get("kind"),
            "class": filters.get("class_id"),
        },
        "currency": settings.USAGE_CURRENCY if price is not None else None,
        "prices": price,
        "budgets": bool(budgets),
        "standings": standings,
        "totals": _measures([sum(t[i] for t in totals.values()) for i in range(len(MEASURES))], price),
        "kinds": [{"kind": kind, **_measures(kinds[kind], price)} for kind in K.values if kind in kinds],
        "rows": rows,
    }


def _sums(first, last, by, scope, filters, now, read_stored):
    """``(totals, labels, kinds)``: the measures per key of ``by`` and per kind, and each key's
    name; the stored days summed in SQL, the others computed live."""
    key_col, label_col = _KEYS[by]
    totals, kinds = defaultdict(lambda: [0] * len(MEASURES)), defaultdict(lambda: [0] * len(MEASURES))
    labels = {}

    def add(key, kind, label, cell):
        _add(totals[key], cell)
        _add(kinds[kind], cell)
        labels[key] = max(labels.get(key, ""), label or "")

    stored = stored_days(first, last) if read_stored else set()
    if stored:
        found = _filtered(_stored_rows(first, last, stored).filter(scope.q()), filters).order_by()
        sums = {name: Sum(name) for name in MEASURES}
        for row in found.values(key_col, "kind").annotate(label=Max(label_col), **sums):
            add(row[key_col], row["kind"], row["label"], [row[m] for m in MEASURES])
    for run in usage._runs([d for d in usage._days(first, last) if d not in stored]):
        for cells in compute(run[0], run[-1], now).values():
            for key, cell in cells.items():
                if _admitted(key, filters, scope):
                    row = dict(zip(_FIELDS, key, strict=True))
                    add(row[key_col], row["kind"], row[label_col], cell)
    return totals, labels, kinds


def _add(into, cell):
    for i, value in enumerate(cell):
        into[i] += value or 0


def _label(by, key, label):
    if key is None or key == "":
        return {"user": "(nobody)", "class": "(no class)", "group": "(no group)", "image": "(none)"}[by]
    return label or (f"class {key}" if by == "class" else str(key))


def _budgets(by, filters, totals):
    """``({key: budget fields}, standings)``: per class, each class's hours budget; per user
    within one class, where its budget stands for each student it binds (``standings``: True),
    over the whole term as of now, beside the range's session hours; ``({}, False)`` where
    classes have none."""
    keys = {k for k in totals if k is not None}
    klass = filters.get("class_id")
    if by == "class" and CLASS_BUDGETS.one() is not None:
        return {k: {"budget_hours": hours} for k, hours in CLASS_BUDGETS.one()(keys).items()}, False
    if by == "user" and klass is not None and STUDENT_BUDGETS.one() is not None:
        found = STUDENT_BUDGETS.one()(klass, keys)
        names = tuple(zip(BUDGET_FIELDS, ("budget", "extra", "used", "left"), strict=True))
        return {k: {field: standing[name] for field, name in names} for k, standing in found.items()}, bool(found)
    return {}, False


def csv_text(data):
    """The report as CSV: a header, one line per row, the totals last. Names are escaped where
    a spreadsheet would run them as formulas."""
    out = io.StringIO()
    w = spreadsheets.csv_writer(out)
    cost = data["prices"] is not None
    head = [data["by"], "name", "hours", "vcpu_hours", "gib_hours", "gpu_hours", "uses"]
    head += [f"cost_{data['currency']}" if data["currency"] else "cost"] if cost else []
    budget = BUDGET_FIELDS if data.get("standings") else BUDGET_FIELDS[:1] if data["budgets"] else ()
    head += list(budget)
    w.writerow(head)
    for row in [*data["rows"], {"key": "total", "label": "", **data["totals"], **dict.fromkeys(BUDGET_FIELDS)}]:
        line = [row["key"], row["label"], *(row[m] for m in ("hours", "vcpu_hours", "gib_hours", "gpu_hours", "uses"))]
        line += [row["cost"]] if cost else []
        line += ["" if row[field] is None else row[field] for field in budget]
        w.writerow(line)
    return out.getvalue()


MAX_CLASS_ID = 2**53  # the API's bound too (``ShowbackQuery``)


def filters_of(params, now=None):
    """``(first, last, by, filters)`` from query parameters (``from``/``to`` or ``first``/``last``,
    ``by``, ``image``, ``group``, ``kind``, ``class``), with a clear ``ValueError``."""
    asked = {
        "from": params.get("from") or params.get("first") or "",
        "to": params.get("to") or params.get("last") or "",
        "image": params.get("image"),
        "group": params.get("group"),
    }
    first, last, image, group = usage.filters(asked, now)
    by = params.get("by") or "user"
    if by not in GROUPINGS:
        raise ValueError(f"by: one of {', '.join(GROUPINGS)}")
    kind = params.get("kind") or None
    if kind is not None and kind not in K.values:
        raise ValueError(f"kind: one of {', '.join(K.values)}")
    klass = params.get("class") or None
    if klass is not None:
        try:
            klass = int(klass)
        except (TypeError, ValueError):
            raise ValueError("class: a class id (a number)") from None
        if not 1 <= klass <= MAX_CLASS_ID:  # (a larger one overflows the column: a 500, not "none")
            raise ValueError(f"class: a class id (1 to {MAX_CLASS_ID})")
    return first, last, by, {"image": image, "group": group, "kind": kind, "class_id": klass}


def choices(scope):
    """Image and group names for the filter form: all of them for those who see everything
    (``usage.choices``), else those of the uses ``scope`` sees."""
    if scope.everything:
        return usage.choices()
    found = UsageRollup.objects.filter(scope.q()).order_by()
    images = set(found.values_list("image", flat=True).distinct())
    groups = set(found.values_list("group", flat=True).distinct())
    return sorted(images), sorted(groups - {""})
