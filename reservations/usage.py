"""Usage reports: reservation hours per image, group and day, peak concurrency, refusals by
reason (capacity, quota, class seats) and mean time to ready, from the reservation history;
the hours idle reclamation gave back (``reclaimed``: no-show and idle ends, live).

Contract: a reservation is *in use* from when a machine was ready for it (``max(start, first
ready)``) to when it stopped (``min(end, first ending/ended/failed/canceled)``, and ``now`` for
one still going). Days are UTC. Its group is its block's group, else its user's first group
(lowest id), else "". Time to ready is from when it was wanted (``max(start, created)``) to its
first ``ready``, never negative, counted on the day it became ready.

``compute(first, last)`` reads the history for the days ``first..last`` in one query and returns
``{day: DayUsage}``; ``reservations.rollup`` stores past days' figures as ``UsageDay`` and
``UsagePeak`` rows with it (the same function, so stored == live), beside showback's;
``report(first, last, image=, group=)`` reads the stored days and computes the days not stored
(today) live. ``csv_text(report)`` is the export. Nothing here writes.
"""

import io
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from django.db.models import Count, Min, Q
from django.db.models.functions import TruncDate
from django.utils import timezone

from core import spreadsheets
from placement import refusals as placement_reasons
from reservations.models import Refusal, Reservation, UsageDay, UsagePeak

S = Reservation.Status
STOPPED = (S.ENDING, S.ENDED, S.FAILED, S.CANCELED)


def with_use_span(reservations):
    """``reservations`` annotated with the moments their use is counted from and to: ``ready_at``
    (a machine first ready) and ``stop_at`` (first ending, ended, failed or canceled; None: not
    yet). The one rule of "used from ready to stop", for this report and classes' hours budgets."""
    return reservations.annotate(
        ready_at=Min("history__at", filter=Q(history__status=S.READY)),
        stop_at=Min("history__at", filter=Q(history__status__in=STOPPED)),
    )


@dataclass
class Cell:
    seconds: int = 0
    reservations: int = 0
    ready_count: int = 0
    ready_seconds: int = 0


@dataclass
class DayUsage:
    cells: dict = field(default_factory=lambda: defaultdict(Cell))  # (image, group) -> Cell
    peaks: dict = field(default_factory=dict)  # (image|None, group|None) -> peak


def day_start(day):
    return datetime.combine(day, time(), tzinfo=UTC)


def _days(first, last):
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def _user_groups(user_ids):
    from django.contrib.auth import get_user_model

    from accounts import access

    # A role group gathers everyone holding the role: it says what one may do, not whose use it is.
    through = get_user_model().groups.through
    first = {}
    rows = (
        through.objects.filter(user_id__in=user_ids)
        .exclude(group_id__in=access.role_groups())
        .order_by("user_id", "group_id")
    )
    for user_id, name in rows.values_list("user_id", "group__name"):
        first.setdefault(user_id, name)
    return first


def group_of_user(user):
    """A user's group for usage (their first group by id that is no role group), "" for none or no user."""
    if user is None:
        return ""
    return _user_groups([user.pk]).get(user.pk, "")


def top_reason(reasons):
    """The code most hosts were refused for (ties in placement's check order); "no_hosts"."""
    order = {code: i for i, code in enumerate(placement_reasons.CHECK_ORDER)}
    counted = [(code, n) for code, n in reasons.items() if n]
    if not counted:
        return "no_hosts"
    return min(counted, key=lambda item: (-item[1], order.get(item[0], len(order)), item[0]))[0][:64]


def _intervals(t0, t1, now):
    """Every reservation that was ready before ``t1`` and not over before ``t0``, as
    (image, group, used_from, used_to, wanted, ready_at, (user_id, vcpus, memory_mib, gpus,
    block_id)) — one query, plus one for groups. The last part is what showback counts."""
    rows = (
        with_use_span(Reservation.objects.filter(end__gt=t0, created__lt=t1))  # created <= ready: a plain WHERE first
        .filter(ready_at__lt=t1)
        .order_by()
        .values_list(
            "image__name",
            "block__group__name",
            "user_id",
            "start",
            "end",
            "created",
            "ready_at",
            "stop_at",
            "vcpus",
            "memory_mib",
            "gpus",
            "block_id",
        )
    )
    rows = list(rows)
    groups = _user_groups({r[2] for r in rows if r[2] is not None and r[1] is None})
    out = []
    for image, block_group, user_id, start, end, created, ready_at, stop_at, *size in rows:
        group = block_group if block_group is not None else groups.get(user_id, "")
        used_to = min(end, stop_at or end, now)
        out.append((image, group, max(start, ready_at), used_to, max(start, created), ready_at, (user_id, *size)))
    return out


def _peak(spans):
    """The most spans ``[a, b)`` overlapping at once (an end before a start at the same time)."""
    points = sorted([(a, 1) for a, b in spans if b > a] + [(b, -1) for a, b in spans if b > a])
    most = held = 0
    for _, step in points:
        held += step
        most = max(most, held)
    return most


def compute(first, last, now=None, intervals=None):
    """``{day: DayUsage}`` for the UTC days ``first..last`` (dates), straight from the history
    (``intervals``: ``_intervals`` of those days already read)."""
    now = now or timezone.now()
    t0, t1 = day_start(first), day_start(last + timedelta(days=1))
    intervals = _intervals(t0, t1, now) if intervals is None else intervals
    out = {day: DayUsage() for day in _days(first, last)}
    spans = {day: defaultdict(list) for day in out}
    for image, group, used_from, used_to, wanted, ready_at, _ in intervals:
        if t0 <= ready_at < t1:
            cell = out[ready_at.astimezone(UTC).date()].cells[(image, group)]
            cell.ready_count += 1
            cell.ready_seconds += max(0, round((ready_at - wanted).total_seconds()))
        if used_to <= used_from:
            continue
        if t0 <= used_from < t1:
            out[used_from.astimezone(UTC).date()].cells[(image, group)].reservations += 1
        day = max(first, used_from.astimezone(UTC).date())
        while day <= last and day_start(day) < used_to:
            a, b = max(used_from, day_start(day)), min(used_to, day_start(day + timedelta(days=1)))
            if b > a:
                out[day].cells[(image, group)].seconds += round((b - a).total_seconds())
                for key in ((None, None), (image, None), (None, group), (image, group)):
                    spans[day][key].append((a, b))
            day += timedelta(days=1)
    for day, by_key in spans.items():
        # The (any, any) row is always there: it marks the day as stored, even an empty one.
        out[day].peaks = {(None, None): 0, **{key: _peak(s) for key, s in by_key.items()}}
    return out


def _stored(first, last, image, group):
    """Stored days in range: {day: (cells list, peak)}; days absent are not stored."""
    rows = UsageDay.objects.filter(day__range=(first, last))
    peaks = UsagePeak.objects.filter(day__range=(first, last), image=image, group=group)
    if image is not None:
        rows = rows.filter(image=image)
    if group is not None:
        rows = rows.filter(group=group)
    marks = UsagePeak.objects.filter(day__range=(first, last), image=None, group=None)
    found = {d: ([], 0) for d in marks.values_list("day", flat=True)}
    for day, peak in peaks.values_list("day", "peak"):
        found[day] = (found[day][0], peak)
    for row in rows.values_list("day", "image", "group", "seconds", "reservations", "ready_count", "ready_seconds"):
        found[row[0]][0].append(((row[1], row[2]), Cell(*row[3:])))
    return found


def _live(days, image, group, now):
    """The same shape as ``_stored`` for ``days``, computed from the history."""
    out = {}
    for run in _runs(days):
        computed = compute(run[0], run[-1], now)
        for day in run:
            usage = computed[day]
            cells = [
                (key, cell)
                for key, cell in usage.cells.items()
                if (image is None or key[0] == image) and (group is None or key[1] == group)
            ]
            out[day] = (cells, usage.peaks.get((image, group), 0))
    return out


def _runs(days):
    """Sorted days cut into runs of consecutive days (one history query per run)."""
    runs = []
    for day in sorted(days):
        if runs and runs[-1][-1] + timedelta(days=1) == day:
            runs[-1].append(day)
        else:
            runs.append([day])
    return runs


def refusals(first, last, image=None, group=None):
    rows = Refusal.objects.filter(at__gte=day_start(first), at__lt=day_start(last + timedelta(days=1)))
    if image is not None:
        rows = rows.filter(image=image)
    if group is not None:
        rows = rows.filter(group=group)
    counts = rows.order_by().values("reason").annotate(n=Count("id")).order_by("-n", "reason")
    per_day = defaultdict(int)
    for day, n in (
        rows.order_by()
        .annotate(day=TruncDate("at", tzinfo=UTC))
        .values("day")
        .annotate(n=Count("id"))
        .values_list("day", "n")
    ):
        per_day[day] = n
    return [{"reason": c["reason"], "label": _refusal_label(c["reason"]), "count": c["n"]} for c in counts], per_day


REFUSAL_LABELS = {"quota": "over a quota", "seats_taken": "every seat of the class taken"}
RECLAIMED_LABELS = {"no_show": "no-show (nobody logged in)", "idle": "idle (no login or input)"}


def _refusal_label(code):
    return REFUSAL_LABELS.get(code) or placement_reasons.phrase(code)


def reclaimed(first, last, image=None, group=None):
    """Reservations ended early by idle reclamation in the days ``first..last``, per reason, with
    the hours given back (from the reclamation to the reservation's planned end). Live from the
    reservations (an index on ``reclaimed_at``): a year is a few thousand rows at most."""
    rows = list(
        Reservation.objects.filter(
            reclaimed_at__gte=day_start(first), reclaimed_at__lt=day_start(last + timedelta(days=1))
        )
        .exclude(reclaimed="")
        .order_by()
        .values_list("reclaimed", "image__name", "block__group__name", "user_id", "end", "reclaimed_at")
    )
    groups = _user_groups({r[3] for r in rows if r[3] is not None and r[2] is None})
    counts, seconds = defaultdict(int), defaultdict(int)
    for kind, img, block_group, user_id, end, at in rows:
        grp = block_group if block_group is not None else groups.get(user_id, "")
        if (image is not None and img != image) or (group is not None and grp != group):
            continue
        counts[kind] += 1
        seconds[kind] += max(0, round((end - at).total_seconds()))
    return [
        {
            "reason": kind,
            "label": RECLAIMED_LABELS.get(kind, kind),
            "count": counts[kind],
            "hours": _hours(seconds[kind]),
        }
        for kind in sorted(counts, key=lambda k: (-seconds[k], k))
    ]


def report(first, last, image=None, group=None, now=None, stored=True):
    """The report for the UTC days ``first..last``: stored days read, the others (today, or all
    with ``stored=False``) computed live. ``image`` / ``group``: names ("" for no group)."""
    now = now or timezone.now()
    days = _days(first, last)
    by_day = _stored(first, last, image, group) if stored else {}
    by_day.update(_live([d for d in days if d not in by_day], image, group, now))
    refused, refused_per_day = refusals(first, last, image, group)
    given_back = reclaimed(first, last, image, group)
    images, groups = defaultdict(int), defaultdict(int)
    total = Cell()
    per_day = []
    for day in days:
        cells, peak = by_day[day]
        seconds = sum(c.seconds for _, c in cells)
        for (img, grp), c in cells:
            images[img] += c.seconds
            groups[grp] += c.seconds
            for name in vars(total):
                setattr(total, name, getattr(total, name) + getattr(c, name))
        per_day.append(
            {
                "day": day.isoformat(),
                "hours": _hours(seconds),
                "reservations": sum(c.reservations for _, c in cells),
                "peak": peak,
                "refusals": refused_per_day.get(day, 0),
            }
        )
    top = max(per_day, key=lambda d: d["peak"], default=None)
    return {
        "from": first.isoformat(),
        "to": last.isoformat(),
        "filters": {"image": image, "group": group},
        "totals": {
            "hours": _hours(total.seconds),
            "reservations": total.reservations,
            "refusals": sum(r["count"] for r in refused),
            "reclaimed": sum(r["count"] for r in given_back),
            "reclaimed_hours": round(sum(r["hours"] for r in given_back), 3),
        },
        "days": per_day,
        "images": _ranked(images, "image"),
        "groups": _ranked(groups, "group"),
        "peak": {"value": top["peak"] if top else 0, "day": top["day"] if top and top["peak"] else None},
        "refusals": refused,
        "reclaimed": given_back,
        "time_to_ready": {
            "count": total.ready_count,
            "mean_seconds": round(total.ready_seconds / total.ready_count, 1) if total.ready_count else None,
        },
    }


def _hours(seconds):
    return round(seconds / 3600, 3)


def _ranked(seconds_by_name, key):
    return [{key: name, "hours": _hours(s)} for name, s in sorted(seconds_by_name.items(), key=lambda i: (-i[1], i[0]))]


def csv_text(data):
    """The report as CSV: one line per day, then the per-image, per-group and refusal tables.
    Names (images, groups) are escaped where a spreadsheet would run them as formulas."""
    out = io.StringIO()
    w = spreadsheets.csv_writer(out)
    w.writerow(["section", "key", "hours", "reservations", "peak", "refusals"])
    for d in data["days"]:
        w.writerow(["day", d["day"], d["hours"], d["reservations"], d["peak"], d["refusals"]])
    for row in data["images"]:
        w.writerow(["image", row["image"], row["hours"], "", "", ""])
    for row in data["groups"]:
        w.writerow(["group", row["group"], row["hours"], "", "", ""])
    for row in data["refusals"]:
        w.writerow(["refusal", row["reason"], "", "", "", row["count"]])
    for row in data.get("reclaimed", []):
        w.writerow(["reclaimed", row["reason"], row["hours"], row["count"], "", ""])
    mean = data["time_to_ready"]["mean_seconds"]
    w.writerow(
        ["time_to_ready_mean_seconds", "", "", data["time_to_ready"]["count"], "", ""]
        if mean is None
        else ["time_to_ready_mean_seconds", mean, "", data["time_to_ready"]["count"], "", ""]
    )
    return out.getvalue()


def parse_day(text, default):
    """``YYYY-MM-DD`` or blank (``default``); ``ValueError`` otherwise."""
    return date.fromisoformat(text) if text else default


MAX_DAYS = 400


def filters(params, now=None):
    """``(first, last, image, group)`` from query parameters, with a clear ``ValueError``.
    Default: the last 30 days to today; at most ``MAX_DAYS``."""
    today = (now or timezone.now()).astimezone(UTC).date()
    try:
        last = parse_day(params.get("to", ""), today)
        first = parse_day(params.get("from", ""), last - timedelta(days=29))
        last + timedelta(days=1)  # the report reads up to the next midnight: it must exist
    except (ValueError, OverflowError):
        raise ValueError("from / to: give dates as YYYY-MM-DD (years 1 to 9999)") from None
    if first > last:
        raise ValueError("from must not be after to")
    if (last - first).days >= MAX_DAYS:
        raise ValueError(f"at most {MAX_DAYS} days at once")
    image = params.get("image") or None
    group = params.get("group")
    return first, last, image, (group if group not in (None, "") else None)


def choices():
    """Image and group names for the filter form: today's images and groups, and those in the
    stored usage (a renamed or deleted one keeps its history)."""
    from django.contrib.auth.models import Group

    from provisioning.models import Image

    stored = UsageDay.objects.order_by()
    images = set(Image.objects.values_list("name", flat=True)) | set(stored.values_list("image", flat=True).distinct())
    groups = set(Group.objects.values_list("name", flat=True)) | set(stored.values_list("group", flat=True).distinct())
    return sorted(images), sorted(groups - {""})


def starts_in(image_ids, windows):
    """``provisioning.warm.STARTS``: ``{image id: [reservations of it starting in each window]}``
    (a user's own, not a block's seats, which are known ahead; one query), the usage history
    a warm pool is sized from."""
    if not windows:
        return {}
    rows = Reservation.objects.filter(image_id__in=image_ids, block__isnull=True, template_of__isnull=True)
    rows = rows.filter(start__gte=min(a for a, _ in windows), start__lt=max(b for _, b in windows))
    counted = {f"w{i}": Count("pk", filter=Q(start__gte=a, start__lt=b)) for i, (a, b) in enumerate(windows)}
    found = rows.values("image_id").annotate(**counted)
    return {row["image_id"]: [row[f"w{i}"] for i in range(len(windows))] for row in found}
