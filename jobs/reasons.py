"""The reason trail: why a job exists, as ``[source, reason, time]`` entries.

Every layer that touches a job appends an entry (the interface that took the request, the
submit service, an expanding parent, the execution); children inherit their parent's trail.
A reason of the form ``rate-limit:N:label`` also names a rate-limit bucket: the bucket is the
whole reason string (as in Ganeti), and at most N of its jobs run at once.
"""

import re

from django.utils import timezone

RATE_LIMIT_PREFIX = "rate-limit:"
RATE_LIMIT_RE = re.compile(r"rate-limit:([0-9]+):(.*)", re.S)
MAX_REASON = 1000
MAX_SOURCE = 100


class BadReason(ValueError):
    pass


def now_iso():
    return timezone.now().isoformat()


def entry(source, reason, when=None):
    return [str(source)[:MAX_SOURCE], str(reason), when or now_iso()]


def bucket(reason):
    """``(reason, N)`` if this reason names a rate-limit bucket, else None; BadReason if malformed."""
    if not isinstance(reason, str) or not reason.startswith(RATE_LIMIT_PREFIX):
        return None
    match = RATE_LIMIT_RE.fullmatch(reason)
    if not match:
        raise BadReason(f"malformed rate-limit reason {reason[:60]!r}: expected rate-limit:N:label, N a whole number")
    n = int(match.group(1))
    if n < 1 or n > 10000:
        raise BadReason(f"rate-limit reason {reason[:60]!r}: N must be between 1 and 10000")
    if not match.group(2).strip():
        raise BadReason(f"rate-limit reason {reason[:60]!r}: the label after N: is empty")
    return reason, n


def check(reason):
    """A reason given by a caller: a non-empty string, at most MAX_REASON long, well-formed if a bucket."""
    if not isinstance(reason, str):
        raise BadReason("must be a string")
    reason = reason.strip()
    if not reason:
        raise BadReason("must not be empty")
    if len(reason) > MAX_REASON:
        raise BadReason(f"at most {MAX_REASON} characters")
    bucket(reason)
    return reason


def buckets(trail):
    """The rate-limit buckets of a trail, ``[[reason, N], …]`` (first occurrence of each)."""
    found = {}
    for item in trail:
        try:
            parsed = bucket(item[1])
        except BadReason:  # validated when it entered the trail; tolerate old rows
            continue
        if parsed and parsed[0] not in found:
            found[parsed[0]] = parsed[1]
    return [[key, n] for key, n in found.items()]


def label(bucket_key):
    """``rate-limit:7:maintenance 123`` → ``maintenance 123``."""
    match = RATE_LIMIT_RE.fullmatch(bucket_key)
    return match.group(2) if match else bucket_key
