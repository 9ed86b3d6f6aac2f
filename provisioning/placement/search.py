"""Finding the best host for one request under the balanced and pack policies.

Contract: `best_host(state, window, hosts, policy)` returns the feasible host (from
``hosts``) with the lowest policy score over the request's window, or None. Feasible means
the host's peak usage over the window plus the request stays within capacity in every
resource (including the VM-count slot) and no anti-affinity partner overlaps.

Scores (lower is better):

- balanced, like hail: the sum over resources of the population standard deviation of
  utilisation (usage at the window's peak / usable capacity) over all online hosts, after
  adding the request to the candidate;
- pack (best fit): the candidate's normalised leftover, Σ (capacity − peak − request) /
  capacity, so the fullest host that still fits wins and empty hosts stay empty.

Both are exact but avoid visiting every host: hosts the window does not touch use exactly
their baseline, which is kept sorted per capacity class. Balanced walks hosts in order of
a lower bound of their score and stops when the bound reaches the best found; pack takes,
per class, the fullest untouched host that fits, and evaluates touched hosts one by one.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .engine import ClusterState, HostSlot
from .model import Policy
from .timeline import fits

#: Below this many candidates, scoring each one beats setting up the pruned walk.
DIRECT_LIMIT = 192


@dataclass(slots=True)
class Window:
    """One request's view of time: its window, need, and what the window touches."""

    start: float
    end: float
    need: tuple[float, ...]
    touched: dict[int, object] | None
    blocked: set[int]
    _sums: tuple[int, list[float], list[float]] | None = None
    _peaks: dict[int, list[float]] | None = None

    def peak(self, state: ClusterState, slot: HostSlot) -> list[float]:
        touched = self.touched
        if touched is not None and slot.idx not in touched:
            return slot.baseline
        cache = self._peaks
        if cache is None:
            cache = self._peaks = {}
        found = cache.get(slot.idx)
        if found is None:
            found = cache[slot.idx] = state.window_peak(slot, self.start, self.end, touched)
        return found


@dataclass(frozen=True, slots=True)
class Choice:
    host: int
    score: float


def window_sums(state: ClusterState, window: Window) -> tuple[int, list[float], list[float]]:
    """(n, Σu, Σu²) per scored resource over online hosts at their window peaks."""
    if window._sums is not None:
        return window._sums
    if window.touched is None:
        n = 0
        s = [0.0] * len(state.scored)
        q = [0.0] * len(state.scored)
        for slot in state.slots:
            if slot.online:
                n += 1
                for k, u in enumerate(state.utilisation(slot, window.peak(state, slot))):
                    s[k] += u
                    q[k] += u * u
    elif len(state.scored) == 3:
        n, s, q = state.n_online, *_touched_sums3(state, window)
    else:
        n = state.n_online
        s = list(state.sum_u)
        q = list(state.sum_u2)
        slots = state.slots
        scored = list(enumerate(state.scored))
        for idx, vector in window.touched.items():
            slot = slots[idx]
            if not slot.online:
                continue
            base = slot.base_util
            if vector is None:
                _shift_sums(s, q, base, state.utilisation(slot, window.peak(state, slot)))
                continue
            # One allocation in the window: utilisation rises by its share, nothing else.
            inv = slot.inv_cap
            for k, r in scored:
                d = vector[r] * inv[k]
                if d:
                    s[k] += d
                    q[k] += d * (2 * base[k] + d)
    window._sums = (n, s, q)
    return window._sums


def _shift_sums(s: list[float], q: list[float], base, now) -> None:
    for k, x in enumerate(now):
        b = base[k]
        if b != x:
            s[k] += x - b
            q[k] += x * x - b * b


def _touched_sums3(state: ClusterState, window: Window) -> tuple[list[float], list[float]]:
    """`window_sums` for the usual three scored resources (vCPUs, memory, disk), unrolled:
    this loop runs over every host the window touches, for every placement."""
    s0, s1, s2 = state.sum_u
    q0, q1, q2 = state.sum_u2
    r0, r1, r2 = state.scored
    slots = state.slots
    several = []
    for idx, vector in window.touched.items():
        slot = slots[idx]
        if not slot.online:
            continue
        if vector is None:
            several.append(slot)
            continue
        i0, i1, i2 = slot.inv_cap
        b0, b1, b2 = slot.base_util
        d = vector[r0] * i0
        s0 += d
        q0 += d * (2 * b0 + d)
        d = vector[r1] * i1
        s1 += d
        q1 += d * (2 * b1 + d)
        d = vector[r2] * i2
        s2 += d
        q2 += d * (2 * b2 + d)
    s, q = [s0, s1, s2], [q0, q1, q2]
    for slot in several:
        _shift_sums(s, q, slot.base_util, state.utilisation(slot, window.peak(state, slot)))
    return s, q


def request_ratios(state: ClusterState, capacity: Sequence[float], need) -> list[float]:
    return [need[r] / capacity[r] if 0 < capacity[r] < math.inf else 0.0 for r in state.scored]


def balanced_score(n, s, q, util, ratio) -> float:
    total = 0.0
    for k, d in enumerate(ratio):
        u = util[k]
        mean = (s[k] + d) / n
        var = (q[k] + 2 * u * d + d * d) / n - mean * mean
        if var > 0:
            total += math.sqrt(var)
    return total


def pack_score(util, ratio) -> float:
    return sum(1.0 - u - d for u, d in zip(util, ratio, strict=True))


def evaluate(state: ClusterState, window: Window, idx: int, policy: Policy) -> float | None:
    """The policy score of placing the request on host ``idx``, or None if it does not fit."""
    if idx in window.blocked:
        return None
    slot = state.slots[idx]
    peak = window.peak(state, slot)
    if not fits(peak, window.need, slot.capacity):
        return None
    util = state.utilisation(slot, peak)
    ratio = request_ratios(state, slot.capacity, window.need)
    if policy == Policy.PACK:
        return pack_score(util, ratio)
    n, s, q = window_sums(state, window)
    return balanced_score(n, s, q, util, ratio)


def best_host(
    state: ClusterState, window: Window, hosts: Sequence[int], policy: Policy
) -> Choice | None:
    if not hosts:
        return None
    if window.touched is None or len(hosts) <= DIRECT_LIMIT:
        return _direct(state, window, hosts, policy)
    eligible = set(hosts)
    if policy == Policy.PACK:
        return _pack(state, window, eligible)
    return _balanced(state, window, eligible)


def _direct(state, window, hosts, policy) -> Choice | None:
    best: Choice | None = None
    for idx in hosts:
        score = evaluate(state, window, idx, policy)
        if score is not None and (best is None or (score, idx) < (best.score, best.host)):
            best = Choice(idx, score)
    return best


def _balanced(state: ClusterState, window: Window, eligible: set[int]) -> Choice | None:
    n, s, q = window_sums(state, window)
    heap: list[tuple[float, int, int]] = []
    ratios = []
    for c, capacity in enumerate(state.class_capacity):
        ratios.append(request_ratios(state, capacity, window.need))
        if state.bal_sorted[c]:
            key = state.bal_sorted[c][0][0]
            heap.append((_lower_bound(n, s, q, key, ratios[c]), c, 0))
    heapq.heapify(heap)
    best: Choice | None = None
    while heap:
        bound, c, pos = heapq.heappop(heap)
        if best is not None and bound >= best.score:
            break
        lst = state.bal_sorted[c]
        _, idx = lst[pos]
        if pos + 1 < len(lst):
            nxt = _lower_bound(n, s, q, lst[pos + 1][0], ratios[c])
            heapq.heappush(heap, (nxt, c, pos + 1))
        if idx not in eligible:
            continue
        score = evaluate(state, window, idx, Policy.BALANCED)
        if score is not None and (best is None or (score, idx) < (best.score, best.host)):
            best = Choice(idx, score)
    return best


def _lower_bound(n, s, q, key, ratio) -> float:
    """Balanced score if every resource of the host sat at its least-used one (``key``)."""
    return balanced_score(n, s, q, [key] * len(ratio), ratio)


def _pack(state: ClusterState, window: Window, eligible: set[int]) -> Choice | None:
    touched = window.touched or {}
    best: Choice | None = None
    nscored = len(state.scored)
    for c, lst in enumerate(state.pack_sorted):
        ratio_sum = sum(request_ratios(state, state.class_capacity[c], window.need))
        for neg_key, idx in lst:
            # Fullest first: the first untouched host that fits is the best of its class.
            if best is not None and (nscored + neg_key - ratio_sum) > best.score + 1e-12:
                break
            if idx in touched or idx not in eligible:
                continue
            score = evaluate(state, window, idx, Policy.PACK)
            if score is None:
                continue
            if best is None or (score, idx) < (best.score, best.host):
                best = Choice(idx, score)
            break
    # Touched hosts: none can be fuller in the window than at its peak from now on, so
    # visit them by that bound and stop once the bound cannot beat the best.
    class_ratio = [sum(request_ratios(state, cap, window.need)) for cap in state.class_capacity]
    bounded = []
    slots = state.slots
    limit = math.inf if best is None else best.score + 1e-12
    for idx in touched.keys() & eligible:
        slot = slots[idx]
        fill = slot.future_fill
        if fill is None:
            fill = state.future_fill(slot)
        bound = nscored - fill - class_ratio[slot.klass]
        if bound <= limit:  # others cannot beat the best untouched host
            bounded.append((bound, idx))
    bounded.sort()
    for bound, idx in bounded:
        if best is not None and bound > best.score + 1e-12:
            break
        score = evaluate(state, window, idx, Policy.PACK)
        if score is not None and (best is None or (score, idx) < (best.score, best.host)):
            best = Choice(idx, score)
    return best
