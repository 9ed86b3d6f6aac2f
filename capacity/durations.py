"""Human durations and times for the CLI and API: ``90m``, ``2h``, ``1d12h``, ``3600``."""

import re
from datetime import UTC, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime

_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_SECONDS = 10 * 366 * 86400


def parse_duration(text):
    """Seconds in ``text`` (``2h``, ``1h30m``, ``45m``, plain seconds); ValueError if not one."""
    text = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    else:
        parts = _PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90m, 2h, 1d12h)")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    if seconds > MAX_SECONDS:
        raise ValueError("a duration must be at most 10 years")
    return timedelta(seconds=seconds)


def parse_moment(text):
    """An aware datetime from ISO 8601 or ``YYYY-MM-DD HH:MM`` (UTC when no zone); ``now`` works."""
    if text in (None, "", "now"):
        return timezone.now()
    try:
        moment = parse_datetime(str(text).strip())
    except ValueError as error:  # well-formed, but no such date or time
        raise ValueError(f"not a valid date and time: {text!r} ({error}; use e.g. 2026-12-01 14:00)") from None
    if moment is None:
        raise ValueError(f"not a date and time: {text!r} (use e.g. 2026-12-01 14:00)")
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)
