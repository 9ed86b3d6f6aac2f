"""Why hosts were rejected: per-reason counts and the closest misses.

Contract: `explain(state, request, window, view)` visits every host once and counts it
under the first check it fails — static checks (see `filters`), then anti-affinity, then
the VM limit, then each resource in resource-space order. Hosts that fail only on capacity
are ranked by how much they lack (relative to their capacity); the nearest few are
reported as `Miss` records. Hosts that fit are not counted.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from . import refusals
from .filters import StaticView
from .model import Request
from .result import Miss
from .search import Window
from .state import ClusterState


def explain(
    state: ClusterState,
    request: Request,
    window: Window,
    view: StaticView,
    limit: int,
    hosts: Iterable[int] | None = None,
) -> tuple[dict[str, int], tuple[Miss, ...]]:
    counts: Counter[str] = Counter()
    misses: list[tuple[float, int, Miss]] = []
    space = state.space
    for idx in range(len(state.slots)) if hosts is None else hosts:
        why = view.reason[idx]
        if why is None and idx in window.blocked:
            why = refusals.ANTI_AFFINITY
        if why is not None:
            counts[why] += 1
            continue
        slot = state.slots[idx]
        peak = window.peak(state, slot)
        short = [max(0.0, p + n - c) if n else 0.0 for p, n, c in zip(peak, window.need, slot.capacity, strict=True)]
        lacking = [r for r in _check_order(len(short)) if short[r] > 1e-9 * max(1.0, slot.capacity[r])]
        if not lacking:
            continue  # fits
        counts[refusals.lacks(space.names[lacking[0]])] += 1
        distance = max(short[r] / slot.capacity[r] if 0 < slot.capacity[r] < math.inf else math.inf for r in lacking)
        miss = Miss(slot.name, refusals.lacks(space.names[lacking[0]]), space.resources(short))
        misses.append((distance, idx, miss))
    misses.sort(key=lambda item: (item[0], item[1]))
    return dict(counts), tuple(m for _, _, m in misses[:limit])


def _check_order(nslots: int) -> list[int]:
    """The VM-count slot is checked before the resources (it is the last slot)."""
    return [nslots - 1, *range(nslots - 1)]


def unknown_resources(state: ClusterState, request: Request) -> list[str]:
    return sorted(name for name in request.resources.extras if name not in state.space.index)


def tag_note(state: ClusterState, request: Request) -> str:
    """What the per-host counts cannot say about required tags: which of them no host
    carries at all (``no host has tag gpu``), or that none carries them all together."""
    wanted = request.required_tags
    if not wanted:
        return ""
    carried = set().union(*(slot.host.tags for slot in state.slots))
    missing = sorted(wanted - carried)
    if missing:
        return f"no host has tag{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    if not any(wanted <= slot.host.tags for slot in state.slots):
        return f"no host has all of the tags {', '.join(sorted(wanted))}"
    return ""
