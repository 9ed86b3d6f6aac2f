"""The placement engine's state: hosts, their timelines and the indexes that keep it fast.

Contract: `ClusterState` is built once from a `Cluster` snapshot (O(allocations)) and then
answers queries and takes allocation changes (add/remove) incrementally. It decides
nothing; the policies in `search`, `explain` and `earliest` read it.

What it maintains, and why:

- per host a `HostTimeline` (exact peak usage over any window);
- a *baseline* per host: the open-ended allocations that started by ``cluster.now``. They
  are active over every window starting at or after ``now``, so a host without other
  allocations in a window uses exactly its baseline there;
- a `TimeIndex` of all other allocations, to find the few hosts a window touches;
- running sums of the baseline utilisation over online hosts (for the balanced score) and,
  per capacity class, hosts sorted by baseline load (for pruned best-host searches).
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, insort

import numpy as np

from .model import Allocation, AllocPolicy, Cluster, Host, HostState, NodeGroup, window_end
from .options import PlacementOptions
from .time_index import Hits, TimeIndex
from .timeline import HostTimeline
from .vectors import ResourceSpace, capacity_vector

#: Recompute the running utilisation sums from scratch after this many updates (float drift).
REFRESH_EVERY = 2000
#: Recompute a host's `future_fill` bound after this many changes (it loosens with each).
FILL_SLACK = 16


class HostSlot:
    """The engine's mutable record of one host."""

    __slots__ = (
        "idx",
        "host",
        "capacity",
        "timeline",
        "baseline",
        "online",
        "klass",
        "bal_key",
        "pack_key",
        "inv_cap",
        "base_util",
        "future_fill",
        "fill_slack",
        "deltas",
    )

    def __init__(self, idx: int, host: Host, capacity: tuple[float, ...], nslots: int) -> None:
        self.idx = idx
        self.host = host
        self.capacity = capacity
        self.timeline = HostTimeline(nslots)
        self.baseline = [0.0] * nslots
        self.online = host.state == HostState.ONLINE
        self.klass = -1
        self.bal_key = 0.0
        self.pack_key = 0.0
        self.inv_cap: list[float] = []
        self.base_util: list[float] = []
        # alloc id -> its utilisation deltas d_k (see `ClusterState._deltas`)
        self.deltas: dict[str, list[float]] = {}
        # Σ utilisation at the host's peak from `now` on (lazy; None = recompute).
        self.future_fill: float | None = None
        # Changes since `future_fill` was exact (it is kept as an upper bound meanwhile).
        self.fill_slack = 0

    @property
    def name(self) -> str:
        return self.host.name


class ClusterState:
    def __init__(self, cluster: Cluster, options: PlacementOptions | None = None) -> None:
        self.cluster = cluster
        self.options = options or PlacementOptions()
        self.now = cluster.now
        self.space = ResourceSpace(_extra_names(cluster))
        self.groups: dict[str, NodeGroup] = {g.name: g for g in cluster.groups}
        for host in cluster.hosts:
            if host.group not in self.groups:
                self.groups[host.group] = NodeGroup(host.group, policy=self.options.default_policy)
        nslots = len(self.space)
        self.slots: list[HostSlot] = []
        self.by_name: dict[str, int] = {}
        for i, host in enumerate(cluster.hosts):
            if host.name in self.by_name:
                raise ValueError(f"duplicate host name {host.name!r}")
            cap = capacity_vector(self.space, host.total, host.reserved, host.overcommit, host.max_vms)
            self.slots.append(HostSlot(i, host, cap, nslots))
            self.by_name[host.name] = i
        self.scored = [r for r in self.space.scored if any(0 < s.capacity[r] < math.inf for s in self.slots)]
        for slot in self.slots:
            # 1/capacity per scored resource (0 where there is none): utilisation is a product.
            slot.inv_cap = [1.0 / slot.capacity[r] if 0 < slot.capacity[r] < math.inf else 0.0 for r in self.scored]
        self.owner: dict[str, int] = {}
        self.allocation: dict[str, Allocation] = {}
        self.anti: dict[str, dict[str, tuple[int, float, float]]] = {}
        self.index = TimeIndex(self.options.bucket_seconds or _bucket_width(cluster), 2 * len(self.scored))
        # Per host: `future_fill` (NaN = unknown) and capacity class, for array-wide bounds.
        self.fill = np.full(len(self.slots), np.nan)
        self.static_cache: dict[tuple, object] = {}
        self.retiring = any(h.available_until is not None for h in cluster.hosts)
        self._updates = 0
        self._build_classes()
        self.klass = np.array([s.klass for s in self.slots], dtype=np.int64)
        # Baselines first, so each indexed allocation's Σu² terms are right when indexed.
        later = []
        for slot in self.slots:
            for alloc in slot.host.allocations:
                vec = self._record(slot, alloc)
                if vec is not None:
                    later.append((slot, alloc, vec))
            self._rekey(slot)
        for slot, alloc, vec in later:
            self._index(slot, alloc, vec)
        self._sort_classes()
        self.refresh_sums()

    # ---------------------------------------------------------------- construction

    def _build_classes(self) -> None:
        """Online hosts with identical capacity form a class (they share request ratios)."""
        classes: dict[tuple[float, ...], int] = {}
        for slot in self.slots:
            if slot.online:
                slot.klass = classes.setdefault(slot.capacity, len(classes))
        self.class_capacity = list(classes)
        self.bal_sorted: list[list[tuple[float, int]]] = [[] for _ in classes]
        self.pack_sorted: list[list[tuple[float, int]]] = [[] for _ in classes]

    def _sort_classes(self) -> None:
        for slot in self.slots:
            if slot.klass >= 0:
                self.bal_sorted[slot.klass].append((slot.bal_key, slot.idx))
                self.pack_sorted[slot.klass].append((slot.pack_key, slot.idx))
        for lst in self.bal_sorted + self.pack_sorted:
            lst.sort()

    # ---------------------------------------------------------------- utilisation

    def utilisation(self, slot: HostSlot, usage) -> list[float]:
        if not isinstance(usage, list):
            usage = list(usage)
        return [usage[r] * inv for r, inv in zip(self.scored, slot.inv_cap, strict=True)]

    def warm(self) -> None:
        """Build every host's step function now instead of on first use."""
        for slot in self.slots:
            slot.timeline.peak(0.0, 0.0)
            self.future_fill(slot)

    def _rekey(self, slot: HostSlot) -> None:
        util = self.utilisation(slot, slot.baseline)
        slot.base_util = util
        # The Σu² terms of the host's indexed allocations depend on its baseline.
        for alloc_id, delta in slot.deltas.items():
            self.index.set_cols(alloc_id, delta + _square_terms(delta, util))
        slot.bal_key = min(util) if util else 0.0
        slot.pack_key = -sum(util)  # stored negated: ascending order = fullest first

    def refresh_sums(self) -> None:
        """Recompute Σu and Σu² of baseline utilisation over online hosts."""
        n = len(self.scored)
        self.sum_u = [0.0] * n
        self.sum_u2 = [0.0] * n
        self.n_online = 0
        for slot in self.slots:
            if slot.online:
                self.n_online += 1
                for k, u in enumerate(self.utilisation(slot, slot.baseline)):
                    self.sum_u[k] += u
                    self.sum_u2[k] += u * u
        self._updates = 0

    def _baseline_changed(self, slot: HostSlot, old: list[float]) -> None:
        if slot.online:
            for k, (u_old, u_new) in enumerate(
                zip(self.utilisation(slot, old), self.utilisation(slot, slot.baseline), strict=True)
            ):
                self.sum_u[k] += u_new - u_old
                self.sum_u2[k] += u_new * u_new - u_old * u_old
            self._updates += 1
        if slot.klass >= 0:
            bal, pack = self.bal_sorted[slot.klass], self.pack_sorted[slot.klass]
            del bal[bisect_left(bal, (slot.bal_key, slot.idx))]
            del pack[bisect_left(pack, (slot.pack_key, slot.idx))]
            self._rekey(slot)
            insort(bal, (slot.bal_key, slot.idx))
            insort(pack, (slot.pack_key, slot.idx))
        else:
            self._rekey(slot)
        if self._updates >= REFRESH_EVERY:
            self.refresh_sums()

    # ---------------------------------------------------------------- allocations

    def is_baseline(self, alloc: Allocation) -> bool:
        return alloc.end is None and alloc.start <= self.now

    def future_fill(self, slot: HostSlot) -> float:
        """Σ over resources of the utilisation at the host's peak from ``now`` on: an upper
        bound of how full the host is in any window (pack prunes with it)."""
        if slot.future_fill is None:
            slot.future_fill = sum(self.utilisation(slot, slot.timeline.peak(self.now, math.inf)))
            slot.fill_slack = 0
            self.fill[slot.idx] = slot.future_fill
        return slot.future_fill

    def _loosen_fill(self, slot: HostSlot, added=None) -> None:
        """Keep `future_fill` an upper bound after a change without rescanning the whole
        timeline (hosts that pack keeps filling hold thousands of segments): an addition
        can raise the peak by at most its own utilisation, a removal never raises it.
        After `FILL_SLACK` changes the bound is recomputed, so it stays tight."""
        if slot.future_fill is None:
            return
        slot.fill_slack += 1
        if slot.fill_slack > FILL_SLACK:
            slot.future_fill = None
            self.fill[slot.idx] = math.nan
        elif added is not None:
            slot.future_fill += sum(self.utilisation(slot, added))
            self.fill[slot.idx] = slot.future_fill

    def _insert(self, slot: HostSlot, alloc: Allocation) -> None:
        old = list(slot.baseline)
        vec = self._record(slot, alloc)
        if vec is None:
            self._baseline_changed(slot, old)
        else:
            self._index(slot, alloc, vec)

    def _record(self, slot: HostSlot, alloc: Allocation) -> tuple[float, ...] | None:
        """Everything but the time index; returns the vector of an allocation that goes
        into the index, None for one added to the host's baseline."""
        if alloc.id in self.owner:
            raise ValueError(f"duplicate allocation id {alloc.id!r}")
        vec = self.space.vector(alloc.resources, vms=1)
        end = window_end(alloc.end)
        slot.timeline.add(alloc.id, alloc.start, end, vec)
        self._loosen_fill(slot, vec)
        self.owner[alloc.id] = slot.idx
        self.allocation[alloc.id] = alloc
        if alloc.anti_affinity:
            self.anti.setdefault(alloc.anti_affinity, {})[alloc.id] = (slot.idx, alloc.start, end)
        if self.is_baseline(alloc):
            for i, v in enumerate(vec):
                slot.baseline[i] += v
            return None
        return vec

    def _index(self, slot: HostSlot, alloc: Allocation, vec: tuple[float, ...]) -> None:
        delta = slot.deltas[alloc.id] = self._deltas(slot, vec)
        self.index.add(
            alloc.id,
            slot.idx,
            alloc.start,
            window_end(alloc.end),
            delta + _square_terms(delta, slot.base_util),
        )

    def _deltas(self, slot: HostSlot, vec: tuple[float, ...]) -> list[float]:
        """The columns the time index keeps per allocation are ``d_1 … d_m, t_1 … t_m``
        over the m scored resources: alone in a window, the allocation raises its host's
        utilisation of resource k by d_k and Σu² by t_k = (b_k + d_k)² − b_k². The d are
        zero on hosts that are not online (they count in no sum); the t follow the host's
        baseline b (`_rekey`)."""
        if slot.online:
            return [vec[r] * inv for r, inv in zip(self.scored, slot.inv_cap, strict=True)]
        return [0.0] * len(self.scored)

    def add(self, host_name: str, alloc: Allocation) -> None:
        """Record an allocation on a host (no capacity check: the caller decided)."""
        if not self.space.knows(alloc.resources):
            raise KeyError(f"allocation {alloc.id!r} uses a resource this cluster lacks")
        self._insert(self.slots[self.by_name[host_name]], alloc)

    def remove(self, alloc_id: str) -> Allocation:
        idx = self.owner.pop(alloc_id)
        alloc = self.allocation.pop(alloc_id)
        slot = self.slots[idx]
        _, _, vec = slot.timeline.remove(alloc_id)
        self._loosen_fill(slot)
        if alloc.anti_affinity:
            members = self.anti[alloc.anti_affinity]
            del members[alloc_id]
            if not members:
                del self.anti[alloc.anti_affinity]
        if alloc_id in self.index:
            self.index.remove(alloc_id)
            del slot.deltas[alloc_id]
        else:
            old = list(slot.baseline)
            for i, v in enumerate(vec):
                slot.baseline[i] -= v
            self._baseline_changed(slot, old)
        return alloc

    def host_of(self, alloc_id: str) -> str:
        return self.slots[self.owner[alloc_id]].name

    def allocations_on(self, host_name: str) -> tuple[Allocation, ...]:
        idx = self.by_name[host_name]
        return tuple(self.allocation[a] for a in self.slots[idx].timeline.entries)

    def snapshot(self) -> Cluster:
        """The current state as a plain `Cluster` (hosts carry their allocations)."""
        import dataclasses

        hosts = tuple(dataclasses.replace(s.host, allocations=self.allocations_on(s.name)) for s in self.slots)
        return dataclasses.replace(self.cluster, hosts=hosts)

    # ---------------------------------------------------------------- queries

    def window_peak(self, slot: HostSlot, start: float, end: float, touched) -> list[float]:
        """Exact per-slot peak usage over the window.

        ``touched``: the hosts with indexed allocations in the window, or None to force the
        timeline (windows starting before ``now``, where the baseline is unsafe).
        """
        if touched is not None and slot.idx not in touched:
            return slot.baseline
        return slot.timeline.peak(start, end)

    def touched_hosts(self, start: float, end: float) -> set[int] | None:
        if start < self.now:
            return None
        return self.index.hosts_overlapping(start, end)

    def window_entries(self, start: float, end: float) -> Hits | None:
        """The indexed allocations overlapping the window (see `Window`), or None for a
        window starting before ``now``, where only the timelines are exact."""
        if start < self.now:
            return None
        return self.index.overlapping(start, end)

    def anti_affinity_hosts(self, group: str | None, start: float, end: float) -> set[int]:
        if not group:
            return set()
        members = self.anti.get(group, {})
        return {h for h, s, e in members.values() if s < end and start < e}

    def anti_affinity_intervals(self, group: str | None, host: int) -> list[tuple[float, float]]:
        if not group:
            return []
        return [(s, e) for h, s, e in self.anti.get(group, {}).values() if h == host]

    def alloc_policy(self, slot: HostSlot) -> AllocPolicy:
        return self.groups[slot.host.group].alloc_policy


def _square_terms(delta, base) -> list[float]:
    """How much Σu² grows when utilisation ``base`` rises by ``delta``: (b + d)² − b².
    Before the host's first `_rekey` (``base`` still empty) zeros stand in."""
    if len(base) != len(delta):
        return [0.0] * len(delta)
    return [d * (2 * b + d) for d, b in zip(delta, base, strict=True)]


def _extra_names(cluster: Cluster) -> set[str]:
    names: set[str] = set()
    for host in cluster.hosts:
        names.update(host.total.extras)
        names.update(host.reserved.extras)
        for alloc in host.allocations:
            names.update(alloc.resources.extras)
    return names


def _bucket_width(cluster: Cluster) -> float:
    """A bucket about as long as a typical reservation: few buckets per allocation."""
    durations = [a.end - a.start for h in cluster.hosts for a in h.allocations if a.end is not None]
    if not durations:
        return 3600.0
    return min(max(statistics.median(durations), 300.0), 7 * 86400.0)
