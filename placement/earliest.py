"""The earliest start at which a request fits somewhere.

Contract: `earliest_fit(state, request, duration, not_before)` returns the smallest
``t >= not_before`` such that some host passing the static checks can take the request over
``[t, t + duration)`` (``duration=None``: open-ended) — or, when no such ``t`` exists within
the horizon, None with the reasons per host.

Exact, never a false "no" or "yes": usage on a host only drops where one of its allocations
ends, so for every host the earliest fitting start is ``not_before`` or one of its own
allocation ends after ``not_before``; each candidate is checked against the host's exact
step function (see `HostTimeline.earliest_start`). The answer is the minimum over hosts.
"""

from __future__ import annotations

import math
from collections import Counter

from . import refusals
from .filters import static_view
from .model import Request
from .result import EarliestFit
from .state import ClusterState
from .timeline import first_short


def earliest_fit(
    state: ClusterState,
    request: Request,
    duration: float | None,
    not_before: float,
    horizon: float | None = None,
) -> EarliestFit:
    view = static_view(state, request)
    limit = math.inf if horizon is None else not_before + horizon
    missing = [n for n in request.resources.extras if n not in state.space.index]
    counts: Counter[str] = Counter(view.counts)
    if missing:
        counts[refusals.lacks(sorted(missing)[0])] += len(view.eligible())
        return EarliestFit(None, None, dict(counts))
    need = state.space.vector(request.resources, vms=request.vms)
    zero = [0.0] * len(need)
    best_t: float | None = None
    best_host: int | None = None
    for idx in sorted(view.eligible()):
        slot = state.slots[idx]
        short = first_short(zero, need, slot.capacity)
        if short is not None:
            counts[refusals.lacks(state.space.names[short])] += 1
            continue
        bound = limit if best_t is None else min(limit, best_t)
        t = slot.timeline.earliest_start(
            need,
            slot.capacity,
            duration,
            not_before,
            state.anti_affinity_intervals(request.anti_affinity, idx),
            horizon=bound,
        )
        if t is None:
            counts[refusals.NOT_FREE] += 1
            continue
        if best_t is None or t < best_t:
            best_t, best_host = t, idx
            if t <= not_before:
                break  # nothing can start earlier
    if best_t is None:
        return EarliestFit(None, None, dict(counts))
    return EarliestFit(best_t, state.slots[best_host].name)
