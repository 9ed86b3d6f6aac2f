"""Local wall-clock time, pure (the standard library's zoneinfo; no Django, no database).

A weekly class meets at the same local hour every week: 14:00 in Berlin stays 14:00 across the
change to summer time, so it is one hour earlier in UTC after it. Adding ``timedelta(weeks=n)``
to an aware datetime in UTC keeps the UTC hour instead; these functions do the arithmetic on the
wall clock of a zone and only then turn the result into an instant.

A local time that does not exist (in the hour skipped in spring) is read as the instant the clock
would have shown had it not jumped (02:30 becomes 03:30 summer time); a local time that happens
twice (in the hour repeated in autumn) is the first of the two (``fold=0``).
"""

from datetime import UTC, timedelta, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones


@lru_cache(maxsize=1)
def zone_names():
    """The IANA zone names this machine knows, as a frozenset (read once: the scan is slow)."""
    return frozenset(available_timezones())


def is_zone(name):
    """Whether ``name`` is an IANA zone name (``Europe/Berlin``, ``UTC``) this machine knows."""
    return isinstance(name, str) and name in zone_names()


def zone(name, default="UTC"):
    """The ``ZoneInfo`` of ``name``, or of ``default`` when ``name`` is blank or unknown."""
    for candidate in (name, default):
        if is_zone(candidate):
            try:
                return ZoneInfo(candidate)
            except (ZoneInfoNotFoundError, ValueError):  # listed but unreadable: a broken tzdata
                continue
    return ZoneInfo("UTC")


def instant(wall, tz):
    """A naive local ``wall`` time in ``tz`` as an aware datetime in ``tz`` that exists."""
    return wall.replace(tzinfo=tz).astimezone(UTC).astimezone(tz)


def wall_clock(moment, tz):
    """The naive local time of ``moment`` in ``tz``; a naive ``moment`` is already local."""
    return moment if moment.tzinfo is None else moment.astimezone(tz).replace(tzinfo=None)


def nth_week(start, tz: tzinfo, week):
    """``start`` moved ``week`` weeks on at the same local wall-clock time in ``tz``.

    ``start`` is aware (any zone: it is read in ``tz``) or naive (a local time in ``tz``). The
    answer is aware, in ``tz``."""
    return instant(wall_clock(start, tz) + timedelta(weeks=week), tz)


def weekly(start, tz: tzinfo, weeks):
    """The ``weeks`` occurrences of ``start``, one a week, at the same local hour in ``tz``:
    a list of aware datetimes, the first being ``start`` itself (as an instant in ``tz``)."""
    return [nth_week(start, tz, week) for week in range(int(weeks))]


def abbreviation(moment, tz: tzinfo):
    """The zone's abbreviation at ``moment`` (``CET``, ``CEST``, ``EST``), or its UTC offset
    (``+0530``) where the zone has no letters for it."""
    return moment.astimezone(tz).strftime("%Z")
