"""A class's calendar: the moments of its weekly sessions over a term, in its time zone.

Pure and Django-free (a test imports it with Django unconfigured; ``core.localtime`` is too): plain values in, plain
values out. A session is a weekday, a local start time and a duration; its occurrences keep
their *local* hour across a daylight-saving change (a 10:00 Monday session in Europe/Berlin is
09:00 UTC in winter and 08:00 UTC in summer), so each one is resolved in the zone on its own
date, never by adding weeks to a UTC moment.

A local time that does not exist on its date (the hour skipped when clocks go forward) is taken
with the offset in force before the change (``fold=0``: 02:30 on the spring-forward night is
03:30 summer time); a time that happens twice (clocks go back) is its first occurrence.
"""

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from core import localtime

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
WEEK_MINUTES = 7 * 24 * 60


@dataclass(frozen=True)
class Session:
    """A weekly session: ``weekday`` 0 (Monday) … 6, ``start`` a local time, ``minutes`` long."""

    weekday: int
    start: time
    minutes: int

    def label(self):
        return f"{WEEKDAYS[self.weekday]} {self.start:%H:%M} ({self.minutes} min)"


@dataclass(frozen=True)
class Occurrence:
    """One session on one date: ``start``/``end`` are aware UTC datetimes; ``index``: which session."""

    day: date
    start: datetime
    end: datetime
    index: int

    def label(self, zone):
        local = self.start.astimezone(zone_of(zone))
        return f"{WEEKDAYS[self.day.weekday()]} {self.day.isoformat()} {local:%H:%M} {zone}"


def zone_of(name):
    """The ``ZoneInfo`` of an IANA name; ``ValueError`` with a plain message if there is none
    (``core.localtime.is_zone``: the one rule of which names are zones, for classes as for a
    user's own zone)."""
    if not localtime.is_zone(name):
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as Europe/Berlin)")
    return localtime.zone(name)


def at_local(day, start, zone):
    """``day`` at local ``start`` in ``zone`` (a ZoneInfo), as an aware UTC datetime."""
    return localtime.instant(datetime.combine(day, start), zone).astimezone(UTC)


def occurrences(first_day, last_day, sessions, zone_name, skip=()):
    """Every occurrence of ``sessions`` from ``first_day`` to ``last_day`` (both included, local
    dates), except on the dates in ``skip``; in order of start."""
    zone = zone_of(zone_name)
    skip = set(skip)
    found = []
    for ordinal in range(first_day.toordinal(), last_day.toordinal() + 1):  # (no date past date.max)
        day = date.fromordinal(ordinal)
        if day not in skip:
            for index, session in enumerate(sessions):
                if session.weekday == day.weekday():
                    start = at_local(day, session.start, zone)
                    found.append(Occurrence(day, start, start + timedelta(minutes=session.minutes), index))
    return sorted(found, key=lambda o: (o.start, o.index))


def overlaps(sessions):
    """Pairs ``(i, j)`` of sessions that overlap within the week (local times; a session that
    runs past midnight, or past Sunday into Monday, counts on the next day)."""

    def span(s):
        begin = s.weekday * 24 * 60 + s.start.hour * 60 + s.start.minute
        return begin, begin + s.minutes

    clashes = []
    for i, a in enumerate(sessions):
        for j in range(i + 1, len(sessions)):
            (a0, a1), (b0, b1) = span(a), span(sessions[j])
            # Compare b also a week earlier and later: Sunday night runs into Monday morning.
            if any(a0 < b1 + shift and b0 + shift < a1 for shift in (-WEEK_MINUTES, 0, WEEK_MINUTES)):
                clashes.append((i, j))
    return clashes


def term_errors(first_day, last_day, sessions, max_days=366):
    """Plain messages per field for a term and its sessions (empty: acceptable)."""
    errors = {}
    if first_day > last_day:
        errors["last_day"] = [f"the last day ({last_day}) is before the first day ({first_day})"]
    elif (last_day - first_day).days >= max_days:
        errors["last_day"] = [f"a term is at most {max_days} days"]
    problems = []
    if not sessions:
        problems.append("give at least one weekly session")
    for s in sessions:
        if not 0 <= s.weekday <= 6:
            problems.append(f"weekday {s.weekday}: 0 (Monday) to 6 (Sunday)")
        if not 5 <= s.minutes <= 12 * 60:
            problems.append(f"{s.label()}: a session lasts 5 minutes to 12 hours")
    for i, j in overlaps(sessions):
        problems.append(f"{sessions[i].label()} overlaps {sessions[j].label()}")
    if problems:
        errors["sessions"] = problems
    return errors


def parse_sessions(text):
    """Sessions from lines such as ``Mon 10:00 90`` (weekday, local start, minutes); ``ValueError``
    naming the bad line."""
    sessions = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        try:
            day, clock, minutes = words
            weekday = [w.lower() for w in WEEKDAYS].index(day[:3].lower())
            sessions.append(Session(weekday, time.fromisoformat(clock), int(minutes)))
        except ValueError:
            shape = "write a weekday, a start and minutes: Mon 10:00 90"
            raise ValueError(f"line {number} {line.strip()!r}: {shape}") from None
    return sessions


def parse_exceptions(text):
    """``[(date, reason)]`` from lines such as ``2027-04-05 Easter Monday``; ``ValueError`` naming the bad line."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split(maxsplit=1)
        if not words:
            continue
        try:
            found.append((date.fromisoformat(words[0]), words[1].strip() if len(words) > 1 else ""))
        except ValueError:
            shape = "write a date and a reason: 2027-04-05 Easter Monday"
            raise ValueError(f"line {number} {line.strip()!r}: {shape}") from None
    return found
