"""Balancing and consolidating our own hosts, with time: hbal and hsqueeze for vclmgr.

Contract:

- `rebalance(cluster, RebalanceOptions(...))` plans moves of VMs running at ``at``
  (default ``cluster.now``) that lower the balanced score (sum over resources of the
  standard deviation of utilisation at ``at`` across online hosts). A move is planned
  only onto an online host of an allocatable group with the same hypervisor type, and
  only if the VM fits there for the rest of its reservation — every future reservation on
  the target stays satisfiable. Scoring is incremental (`balance_core`).
- `consolidate(cluster, target_utilisation=0.8)` finds hosts that can be emptied (and
  powered off): least loaded first, a host is emptied when all its current and future
  allocations fit elsewhere without pushing any receiving host above
  ``target_utilisation`` of its capacity at any instant.

Both return plans (moves in order) and never mutate the given cluster.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from . import balance_core as core
from .engine import ClusterState, HostSlot
from .model import Allocation, AllocPolicy, Cluster, window_end
from .timeline import EPSILON, fits


@dataclass(frozen=True, slots=True)
class RebalanceOptions:
    at: float | None = None
    max_moves: int = -1
    #: Stop once a move gains less than this (score units: summed standard deviations).
    min_gain: float = 1e-4
    min_gain_limit: float = 0.0


@dataclass(frozen=True, slots=True)
class PlannedMove:
    allocation: str
    source: str
    target: str
    score: float

    def to_dict(self) -> dict:
        return {
            "allocation": self.allocation,
            "from": self.source,
            "to": self.target,
            "score": self.score,
        }


@dataclass(slots=True)
class RebalancePlan:
    initial_score: float
    final_score: float
    moves: list[PlannedMove] = field(default_factory=list)
    cluster: Cluster | None = None

    def to_dict(self) -> dict:
        return {
            "initial_score": self.initial_score,
            "final_score": self.final_score,
            "moves": [m.to_dict() for m in self.moves],
        }


def _can_receive(state: ClusterState, slot: HostSlot) -> bool:
    return slot.online and state.alloc_policy(slot) != AllocPolicy.UNALLOCATABLE


def _moved(alloc: Allocation, at: float) -> Allocation:
    return dataclasses.replace(alloc, start=max(alloc.start, at))


def _fits_on(state: ClusterState, slot: HostSlot, alloc: Allocation, at: float, cap=None):
    start, end = max(alloc.start, at), window_end(alloc.end)
    vec = state.space.vector(alloc.resources, vms=1)
    if any(
        s < end and start < e
        for s, e in state.anti_affinity_intervals(alloc.anti_affinity, slot.idx)
    ):
        return None
    peak = slot.timeline.peak(start, end)
    if not fits(peak, vec, cap or slot.capacity):
        return None
    return vec


class _HostProblem(core.BalanceProblem):
    def __init__(self, state: ClusterState, at: float) -> None:
        self.state = state
        self.at = at
        self.receivers = [s.idx for s in state.slots if _can_receive(state, s)]

    def values(self, slot: HostSlot) -> tuple[float, ...]:
        return tuple(self.state.utilisation(slot, slot.timeline.usage_at(self.at)))

    def items(self):
        at = self.at
        out = []
        for alloc_id, alloc in self.state.allocation.items():
            if alloc.start <= at < window_end(alloc.end):
                out.append(alloc_id)
        return sorted(out)

    def moves(self, item):
        source = self.state.slots[self.state.owner[item]]
        return [
            t
            for t in self.receivers
            if t != source.idx and self.state.slots[t].host.hypervisor == source.host.hypervisor
        ]

    def involved(self, item, move):
        return (self.state.owner[item], move)

    def evaluate(self, item, move):
        state = self.state
        alloc = state.allocation[item]
        target = state.slots[move]
        vec = _fits_on(state, target, alloc, self.at)
        if vec is None:
            return None
        source = state.slots[state.owner[item]]
        src_usage = [u - v for u, v in zip(source.timeline.usage_at(self.at), vec, strict=True)]
        dst_usage = [u + v for u, v in zip(target.timeline.usage_at(self.at), vec, strict=True)]
        return core.Evaluation(
            [
                (source.idx, tuple(state.utilisation(source, src_usage))),
                (target.idx, tuple(state.utilisation(target, dst_usage))),
            ]
        )

    def apply(self, item, move, evaluation):
        state = self.state
        source = state.slots[state.owner[item]].name
        alloc = state.remove(item)
        state.add(state.slots[move].name, _moved(alloc, self.at))
        evaluation.payload = (source, state.slots[move].name)


def rebalance(cluster: Cluster, options: RebalanceOptions | None = None) -> RebalancePlan:
    opts = options or RebalanceOptions()
    at = cluster.now if opts.at is None else opts.at
    state = ClusterState(cluster)
    problem = _HostProblem(state, at)
    k = len(state.scored)
    board = core.Scoreboard(
        [core.STD] * k,
        [1.0] * k,
        [problem.values(s) for s in state.slots],
        [s.online for s in state.slots],
    )
    initial = board.score
    rule = core.GainRule(opts.min_gain, opts.min_gain_limit, 1e-12, opts.max_moves)
    stats = core.greedy_balance(problem, board, rule)
    moves = [
        PlannedMove(str(step.item), step.payload[0], step.payload[1], step.score)
        for step in stats.moves
    ]
    board.recompute()
    return RebalancePlan(initial, board.score, moves, state.snapshot())


@dataclass(slots=True)
class ConsolidationPlan:
    target_utilisation: float
    emptied: list[str] = field(default_factory=list)
    already_empty: list[str] = field(default_factory=list)
    moves: list[PlannedMove] = field(default_factory=list)
    cluster: Cluster | None = None

    def to_dict(self) -> dict:
        return {
            "target_utilisation": self.target_utilisation,
            "emptied": self.emptied,
            "already_empty": self.already_empty,
            "moves": [m.to_dict() for m in self.moves],
        }


def consolidate(
    cluster: Cluster, target_utilisation: float = 0.8, at: float | None = None
) -> ConsolidationPlan:
    moment = cluster.now if at is None else at
    state = ClusterState(cluster)
    plan = ConsolidationPlan(target_utilisation)
    live = [s for s in state.slots if _can_receive(state, s)]

    def pending(slot: HostSlot) -> list[Allocation]:
        return [
            state.allocation[a]
            for a in slot.timeline.entries
            if window_end(state.allocation[a].end) > moment
        ]

    def load(slot: HostSlot) -> float:
        return sum(state.utilisation(slot, slot.timeline.peak(moment, math.inf)))

    closed: set[int] = set()
    for slot in sorted(live, key=lambda s: (load(s), s.idx)):
        allocs = pending(slot)
        if not allocs:
            plan.already_empty.append(slot.name)
            closed.add(slot.idx)
            continue
        done: list[tuple[str, Allocation, str]] = []
        for alloc in sorted(allocs, key=lambda a: -sum(a.resources.as_dict().values())):
            target = _best_fit(state, alloc, moment, target_utilisation, closed | {slot.idx})
            if target is None:
                break
            state.remove(alloc.id)
            state.add(target.name, _moved(alloc, moment))
            done.append((alloc.id, alloc, target.name))
        if len(done) < len(allocs):
            for alloc_id, alloc, _ in reversed(done):  # roll this host back
                state.remove(alloc_id)
                state.add(slot.name, alloc)
            continue
        closed.add(slot.idx)
        plan.emptied.append(slot.name)
        plan.moves += [PlannedMove(a, slot.name, t, 0.0) for a, _, t in done]
    plan.cluster = state.snapshot()
    return plan


def _best_fit(state: ClusterState, alloc: Allocation, at: float, ratio: float, excluded):
    """Pack: the receiving host left fullest (within ``ratio`` of capacity) wins."""
    source = state.slots[state.owner[alloc.id]]
    best, best_key = None, None
    for slot in state.slots:
        if slot.idx in excluded or not _can_receive(state, slot):
            continue
        if slot.host.hypervisor != source.host.hypervisor:
            continue
        cap = [
            c if (i == state.space.vms_slot or c == math.inf) else c * ratio + EPSILON
            for i, c in enumerate(slot.capacity)
        ]
        vec = _fits_on(state, slot, alloc, at, cap)
        if vec is None:
            continue
        peak = slot.timeline.peak(max(alloc.start, at), window_end(alloc.end))
        after = sum(state.utilisation(slot, [p + v for p, v in zip(peak, vec, strict=True)]))
        key = (-after, slot.idx)
        if best_key is None or key < best_key:
            best, best_key = slot, key
    return best
