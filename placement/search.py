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

import numpy as np

from .model import Policy
from .state import ClusterState, HostSlot
from .time_index import Hits
from .timeline import fits

#: Below this many candidates, scoring each one beats setting up the pruned walk.
DIRECT_LIMIT = 192


@dataclass(slots=True)
class Window:
    """One request's view of time: its window, need, and what the window touches.

    ``entries``: the indexed allocations overlapping the window (`TimeIndex.overlapping`),
    or None to read every host's timeline (windows starting before ``now``). `touched`
    and the score sums are derived from them on first use.
    """

    start: float
    end: float
    need: tuple[float, ...]
    entries: Hits | None
    blocked: set[int]
    _touched: set[int] | None = None
    _sums: tuple[int, list[float], list[float]] | None = None
    _peaks: dict[int, list[float]] | None = None

    @property
    def touched(self) -> set[int] | None:
        """The hosts with indexed allocations in the window; None when ``entries`` is."""
        if self._touched is None and self.entries is not None:
            self._touched = set(self.entries.hosts().tolist())
        return self._touched

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
    if window.entries is None:
        n = 0
        s = [0.0] * len(state.scored)
        q = [0.0] * len(state.scored)
        for slot in state.slots:
            if slot.online:
                n += 1
                for k, u in enumerate(state.utilisation(slot, window.peak(state, slot))):
                    s[k] += u
                    q[k] += u * u
    else:
        n, s, q = state.n_online, *_hit_sums(state, window)
    window._sums = (n, s, q)
    return window._sums


def _hit_sums(state: ClusterState, window: Window) -> tuple[list[float], list[float]]:
    """Σu and Σu² at the window's peaks, from the engine's baseline sums and the columns
    of the allocations the window overlaps (``d`` and ``t``, see `ClusterState._deltas`).

    Every allocation is first counted as if alone on its host. A host with two is then
    corrected in closed form: if the two overlap each other its peak has both, so Σu is
    right and Σu² lacks the cross term 2·d_a·d_b; if not, its peak is the larger of the
    two in each resource, so both sums over-count by the smaller one (t grows with d).
    Hosts with three or more — rare — are corrected with their timeline's exact peak."""
    hits = window.entries
    m = len(state.scored)
    s, q = list(state.sum_u), list(state.sum_u2)
    if not len(hits):
        return s, q
    cols = hits.cols
    total = cols.sum(axis=0)
    order, run_starts, counts = hits.runs()
    if len(run_starts) < len(order):
        pairs = run_starts[counts == 2]
        if len(pairs):
            a, b = order[pairs], order[pairs + 1]
            apart = ~((hits.start[a] < hits.end[b]) & (hits.start[b] < hits.end[a]))
            da, db = cols[a], cols[b]
            fix = np.minimum(da, db)
            fix *= -1.0
            both = ~apart
            fix[both, :m] = 0.0
            fix[both, m:] = 2.0 * da[both, :m] * db[both, :m]
            total += fix.sum(axis=0)
        crowded = run_starts[counts > 2]
        if len(crowded):
            peaks = window._peaks
            if peaks is None:
                peaks = window._peaks = {}
            slots = state.slots
            for first, count in zip(crowded.tolist(), counts[counts > 2].tolist(), strict=True):
                rows = order[first : first + count]
                slot = slots[int(hits.host[rows[0]])]
                if not slot.online:
                    continue  # its columns are zero
                total -= cols[rows].sum(axis=0)
                peak = peaks[slot.idx] = slot.timeline.peak(window.start, window.end)
                _shift_sums(s, q, slot.base_util, state.utilisation(slot, peak))
    total = total.tolist()
    for k in range(m):
        s[k] += total[k]
        q[k] += total[m + k]
    return s, q


def _shift_sums(s: list[float], q: list[float], base, now) -> None:
    for k, x in enumerate(now):
        b = base[k]
        if b != x:
            s[k] += x - b
            q[k] += x * x - b * b


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


def best_host(state: ClusterState, window: Window, hosts: Sequence[int], policy: Policy) -> Choice | None:
    if not hosts:
        return None
    if window.entries is None or len(hosts) <= DIRECT_LIMIT:
        return _direct(state, window, hosts, policy)
    eligible = _as_set(state, hosts)
    if policy == Policy.PACK:
        return _pack(state, window, eligible)
    return _balanced(state, window, eligible)


def _as_set(state: ClusterState, hosts: Sequence[int]) -> frozenset[int]:
    """``hosts`` as a set, cached: the static view hands out the same tuples every time,
    and building a set of 10,000 hosts would cost more than the whole search."""
    key = ("set", id(hosts))
    cached = state.static_cache.get(key)
    if cached is None or cached[0] is not hosts:
        cached = state.static_cache[key] = (hosts, frozenset(hosts))
    return cached[1]


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


def _pack(state: ClusterState, window: Window, eligible: frozenset[int]) -> Choice | None:
    touched = window.touched or set()
    slots = state.slots
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
    # visit them by that bound and stop once the bound cannot beat the best. The bounds
    # of all of them at once, as arrays: a window touches hundreds.
    if not touched:
        return best
    hosts = window.entries.hosts()
    hosts = hosts[_eligible_mask(state, eligible)[hosts]]
    fill = state.fill[hosts]
    unknown = np.isnan(fill)
    if unknown.any():
        for idx in hosts[unknown].tolist():
            state.future_fill(slots[idx])
        fill = state.fill[hosts]
    class_ratio = np.array([sum(request_ratios(state, cap, window.need)) for cap in state.class_capacity] + [0.0])
    bounds = nscored - fill - class_ratio[state.klass[hosts]]
    limit = math.inf if best is None else best.score + 1e-12
    keep = bounds <= limit  # others cannot beat the best untouched host
    bounded = sorted(zip(bounds[keep].tolist(), hosts[keep].tolist(), strict=True))
    for bound, idx in bounded:
        if best is not None and bound > best.score + 1e-12:
            break
        score = evaluate(state, window, idx, Policy.PACK)
        if score is not None and (best is None or (score, idx) < (best.score, best.host)):
            best = Choice(idx, score)
    return best


def _eligible_mask(state: ClusterState, eligible: frozenset[int]) -> np.ndarray:
    """``eligible`` as a boolean array over hosts, cached like `_as_set`."""
    key = ("mask", id(eligible))
    cached = state.static_cache.get(key)
    if cached is None or cached[0] is not eligible:
        mask = np.zeros(len(state.slots), dtype=bool)
        mask[list(eligible)] = True
        cached = state.static_cache[key] = (eligible, mask)
    return cached[1]
