"""How many warm VMs a pool wants for the coming hour, from its usage history.

Pure (the standard library only: no Django, no database): ``provisioning.warm`` feeds it the
numbers its thin query read — the reservations of the image that started in the same weekday
and hour of each past week — and the image's ``warm_min``/``warm_max``.
"""

from datetime import timedelta
from math import ceil


def percentile(values, q):
    """The nearest-rank ``q``-th percentile (1..100) of ``values``; 0 of none."""
    if not values:
        return 0
    if not 0 < q <= 100:
        raise ValueError(f"a percentile is within 1..100, not {q}")
    ordered = sorted(values)
    return ordered[max(1, ceil(q / 100 * len(ordered))) - 1]


def wanted(past, low, high, q=75):
    """Warm VMs for the coming hour: the ``q``-th percentile of ``past`` (one count per past
    week, of starts in that week's same hour), within ``low``..``high``. No history: ``low``."""
    if low > high:
        raise ValueError(f"a minimum ({low}) above the maximum ({high})")
    return min(high, max(low, percentile(list(past), q)))


def hour_windows(now, weeks):
    """``[(start, end)]``: the hour from ``now`` in each of the last ``weeks`` weeks, the latest first."""
    return [(now - timedelta(weeks=w), now - timedelta(weeks=w) + timedelta(hours=1)) for w in range(1, weeks + 1)]
