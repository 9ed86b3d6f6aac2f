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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter

from .engine import ClusterState, HostSlot
from .model import Policy
from .timeline import fits

#: Below this many candidates, scoring each one beats setting up the pruned walk.
DIRECT_LIMIT = 192


@dataclass(slots=True)
class Window:
    """One request's view of time: its window, need, and what the window touches.

    ``entries``: the indexed allocations overlapping the window (`TimeIndex.overlapping`),
    or None to read every host's timeline (windows starting before ``now``). `touched`
    and the score sums are derived from them on first use, together when both are needed.
    """

    start: float
    end: float
    need: tuple[float, ...]
    entries: list[tuple] | None
    blocked: set[int]
    _touched: dict[int, object] | None = None
    _sums: tuple[int, list[float], list[float]] | None = None
    _peaks: dict[int, list[float]] | None = None

    @property
    def touched(self) -> dict[int, object] | None:
        """Host → the one overlapping allocation's payload (None if several), as
        `TimeIndex.hosts_overlapping`; None when ``entries`` is."""
        if self._touched is None and self.entries is not None:
            hosts = list(map(_HOST, self.entries))
            hits = dict(zip(hosts, map(_PAYLOAD, self.entries), strict=True))
            if len(hits) < len(hosts):
                for host, count in Counter(hosts).items():
                    if count > 1:
                        hits[host] = None
            self._touched = hits
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
    elif window._touched is None:
        n, s, q = state.n_online, *_touched_sums(state, window)
    else:
        n = state.n_online
        s = list(state.sum_u)
        q = list(state.sum_u2)
        slots = state.slots
        m = len(s)
        for idx, payload in window.touched.items():
            if payload is None:
                slot = slots[idx]
                if slot.online:
                    _shift_sums(s, q, slot.base_util, state.utilisation(slot, window.peak(state, slot)))
                continue
            # One allocation in the window: utilisation rises by its share, nothing else.
            for k in range(m):
                s[k] += payload[2 + k]
                q[k] += payload[2 + m + k]
    window._sums = (n, s, q)
    return window._sums


def _shift_sums(s: list[float], q: list[float], base, now) -> None:
    for k, x in enumerate(now):
        b = base[k]
        if b != x:
            s[k] += x - b
            q[k] += x * x - b * b


def _touched_sums(state: ClusterState, window: Window) -> tuple[list[float], list[float]]:
    """Σu and Σu² at the window's peaks from the engine's baseline sums, building
    `Window.touched` on the way. This runs over every allocation the window overlaps, for
    every placement, so the loops are C builtins (``sum``/``map``/``dict``/``Counter``)
    over the payloads' precomputed deltas and Σu² terms (see `ClusterState._payload`):
    every allocation is first counted as if alone on its host, then hosts with several
    are corrected with their exact peak."""
    entries = window.entries
    m = len(state.scored)
    s, q = list(state.sum_u), list(state.sum_u2)
    payloads = list(map(_PAYLOAD, entries))
    hosts = list(map(_HOST, entries))
    hits: dict[int, object] = dict(zip(hosts, payloads, strict=True))
    for k in range(m):
        s[k] += sum(map(itemgetter(2 + k), payloads))
        q[k] += sum(map(itemgetter(2 + m + k), payloads))
    window._touched = hits
    if len(hits) == len(entries):
        return s, q
    several: dict[int, list] = {h: [] for h, count in Counter(hosts).items() if count > 1}
    for entry in [en for en in entries if en[0] in several]:
        several[entry[0]].append(entry)
    slots = state.slots
    peaks = window._peaks
    if peaks is None:
        peaks = window._peaks = {}
    for idx, group in several.items():
        hits[idx] = None
        slot = slots[idx]
        if not slot.online:
            continue  # its deltas and terms are zero
        for entry in group:  # counted above as if alone: take them back
            payload = entry[3]
            for k in range(m):
                s[k] -= payload[2 + k]
                q[k] -= payload[2 + m + k]
        peak = peaks[idx] = _several_peak(slot, group, window)
        _shift_sums(s, q, slot.base_util, state.utilisation(slot, peak))
    return s, q


_HOST = itemgetter(0)
_PAYLOAD = itemgetter(3)


def _several_peak(slot: HostSlot, group: list[tuple], window: Window) -> list[float]:
    """Peak usage over the window of a host with several overlapping allocations. Two,
    the usual case, need no timeline: if they overlap each other, some instant of the
    window has both (intervals that pairwise intersect share a point), else never."""
    if len(group) != 2:
        return slot.timeline.peak(window.start, window.end)
    (_, s1, e1, (v1, *_), _), (_, s2, e2, (v2, *_), _) = group
    if s1 < e2 and s2 < e1:
        return [b + x + y for b, x, y in zip(slot.baseline, v1, v2, strict=True)]
    return [b + max(x, y) for b, x, y in zip(slot.baseline, v1, v2, strict=True)]


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
