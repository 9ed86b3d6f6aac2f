"""One host's usage over time, as a step function.

Contract: `HostTimeline` holds a host's allocations (vectors over a `ResourceSpace`) and
answers, exactly, "what is the peak usage over ``[start, end)``" and "what is the earliest
start at which this request fits". Usage only drops when an allocation ends, so the
earliest fitting start is always ``not_before`` or one of this host's allocation ends —
the search looks at those candidates only and is exact.

The step function is rebuilt lazily (after add/remove) from the allocations; a host holds
tens of allocations, so a rebuild is cheap and the queries are bisects plus slice maxima.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

#: Relative tolerance for capacity comparisons, so float sums like 0.1 + 0.2 don't refuse.
EPSILON = 1e-9

Vector = Sequence[float]


def fits(peak: Vector, need: Vector, capacity: Vector) -> bool:
    for p, n, c in zip(peak, need, capacity, strict=True):
        if n and p + n > c + EPSILON * (1.0 if c == math.inf else max(1.0, c)):
            return False
    return True


def first_short(peak: Vector, need: Vector, capacity: Vector) -> int | None:
    """Index of the first slot where ``peak + need`` exceeds capacity, else None."""
    for i, (p, n, c) in enumerate(zip(peak, need, capacity, strict=True)):
        if n and p + n > c + EPSILON * (1.0 if c == math.inf else max(1.0, c)):
            return i
    return None


class HostTimeline:
    __slots__ = ("nslots", "entries", "_times", "_cols", "_dirty")

    def __init__(self, nslots: int) -> None:
        self.nslots = nslots
        # alloc id -> (start, end, vector); end is math.inf when open-ended
        self.entries: dict[str, tuple[float, float, tuple[float, ...]]] = {}
        self._times: list[float] = []
        self._cols: list[list[float]] = []
        self._dirty = True

    def add(self, alloc_id: str, start: float, end: float, vector: tuple[float, ...]) -> None:
        if alloc_id in self.entries:
            raise ValueError(f"allocation {alloc_id!r} already on this host")
        self.entries[alloc_id] = (start, end, vector)
        if not self._dirty:
            self._shift(start, end, vector, 1.0)

    def remove(self, alloc_id: str) -> tuple[float, float, tuple[float, ...]]:
        entry = self.entries.pop(alloc_id)
        if not self._dirty:
            self._shift(entry[0], entry[1], entry[2], -1.0)
        return entry

    def _split(self, t: float) -> int:
        """Index of the segment starting at ``t``, creating the breakpoint if needed."""
        times = self._times
        i = bisect_left(times, t)
        if i < len(times) and times[i] == t:
            return i
        times.insert(i, t)
        for col in self._cols:
            col.insert(i, col[i - 1])
        return i

    def _shift(self, start: float, end: float, vector, sign: float) -> None:
        # Update the built step function in place: O(segments in the window), not a
        # rebuild — hosts that keep receiving VMs (pack) would otherwise rebuild each time.
        i0 = self._split(start)
        i1 = len(self._times) if end == math.inf else self._split(end)
        for col, v in zip(self._cols, vector, strict=True):
            if v:
                dv = sign * v
                for i in range(i0, i1):
                    col[i] += dv

    def __len__(self) -> int:
        return len(self.entries)

    def _build(self) -> None:
        deltas: dict[float, list[float]] = {}
        n = self.nslots
        for start, end, vec in self.entries.values():
            row = deltas.setdefault(start, [0.0] * n)
            for i in range(n):
                row[i] += vec[i]
            if end != math.inf:
                row = deltas.setdefault(end, [0.0] * n)
                for i in range(n):
                    row[i] -= vec[i]
        # A sentinel at -inf carries zero usage, so every instant falls in some segment.
        times = [-math.inf]
        cols = [[0.0] for _ in range(n)]
        running = [0.0] * n
        for t in sorted(deltas):
            row = deltas[t]
            for i in range(n):
                running[i] += row[i]
                cols[i].append(running[i])
            times.append(t)
        self._times = times
        self._cols = cols
        self._dirty = False

    def peak(self, start: float, end: float) -> list[float]:
        """Per-slot maximum usage over ``[start, end)``."""
        if self._dirty:
            self._build()
        times = self._times
        i0 = bisect_right(times, start) - 1
        i1 = len(times) if end == math.inf else bisect_left(times, end)
        if i1 <= i0 + 1:
            # One segment covers the whole window: the common case, no slicing needed.
            return [col[i0] for col in self._cols]
        return [max(col[i0:i1]) for col in self._cols]

    def usage_at(self, t: float) -> list[float]:
        if self._dirty:
            self._build()
        i = bisect_right(self._times, t) - 1
        return [col[i] for col in self._cols]

    def ends_after(self, t: float) -> list[float]:
        return sorted({e for _, e, _ in self.entries.values() if t < e < math.inf})

    def earliest_start(
        self,
        need: Vector,
        capacity: Vector,
        duration: float | None,
        not_before: float,
        blocked: Iterable[tuple[float, float]] = (),
        horizon: float = math.inf,
    ) -> float | None:
        """Earliest ``t >= not_before`` (and ``<= horizon``) where ``[t, t+duration)`` fits.

        ``blocked`` are intervals the window must not overlap (anti-affinity partners).
        ``duration=None`` asks for an open-ended window.
        """
        if first_short([0.0] * self.nslots, need, capacity) is not None:
            return None  # larger than the empty host: never fits
        blocked = list(blocked)
        for t in [not_before, *self.ends_after(not_before)]:
            if t > horizon:
                return None
            end = math.inf if duration is None else t + duration
            if any(b_start < end and t < b_end for b_start, b_end in blocked):
                continue
            if fits(self.peak(t, end), need, capacity):
                return t
        return None
