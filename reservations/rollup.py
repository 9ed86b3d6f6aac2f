"""The stored history of use: each day's figures of both reports, written at once.

``aggregate`` reads the day's history once and replaces what was stored of it: the reservation
report's ``UsageDay`` and ``UsagePeak`` (``reservations.usage``) and showback's per-user
``UsageRollup`` rows (``reservations.showback``), in one transaction; the hourly task stores
the last days, ``manage.py usage_backfill`` any range."""

from datetime import UTC, timedelta

from django.db import transaction
from django.utils import timezone

from reservations import showback, usage
from reservations.models import UsageDay, UsagePeak, UsageRollup


def aggregate(first, last=None, now=None):
    """Store the days ``first..last`` (one history query), replacing what was stored: the
    reservation figures (``UsageDay``, ``UsagePeak``) and every kind's use per user, class,
    group and image (``UsageRollup``, ``reservations.showback``), in one transaction."""
    last = last or first
    now = now or timezone.now()
    intervals = usage._intervals(usage.day_start(first), usage.day_start(last + timedelta(days=1)), now)
    computed = usage.compute(first, last, now, intervals)
    rolled = showback.compute(first, last, now, intervals)
    with transaction.atomic():
        UsageDay.objects.filter(day__range=(first, last)).delete()
        UsagePeak.objects.filter(day__range=(first, last)).delete()
        UsageRollup.objects.filter(span__in=("day", "mark"), day__range=(first, last)).delete()
        showback.store(rolled)
        showback.roll_months(first, last)
        UsageDay.objects.bulk_create(
            [
                UsageDay(day=day, image=image, group=group, **vars(cell))
                for day, usage in computed.items()
                for (image, group), cell in usage.cells.items()
            ],
            batch_size=1000,
        )
        UsagePeak.objects.bulk_create(
            [
                UsagePeak(day=day, image=image, group=group, peak=peak)
                for day, usage in computed.items()
                for (image, group), peak in usage.peaks.items()
            ],
            batch_size=1000,
        )
    return sorted(computed)


def aggregate_missing(now=None, days=2):
    """The periodic task: store the last ``days`` complete days (re-done: late history changes
    such as an end recorded after midnight are picked up). Returns the days stored."""
    today = (now or timezone.now()).astimezone(UTC).date()
    return aggregate(today - timedelta(days=days), today - timedelta(days=1), now)


def backfill(first, last, now=None, chunk=31):
    """Store every day ``first..last`` (dates; never today or later), a month per query."""
    today = (now or timezone.now()).astimezone(UTC).date()
    last = min(last, today - timedelta(days=1))
    stored = []
    while first <= last:
        stop = min(last, first + timedelta(days=chunk - 1))
        stored += aggregate(first, stop, now)
        first = stop + timedelta(days=1)
    return stored


# --- the report -------------------------------------------------------------------------------
