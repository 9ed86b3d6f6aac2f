"""Consolidation on the Ganeti model: which nodes can be emptied and powered off (hsqueeze).

Contract: `squeeze(cluster, target_resources=2.0, minimal_resources=2.0)` follows htools'
hsqueeze: candidates are online, non-master nodes without DRBD secondaries whose primaries
all use external storage; trying the fullest candidates last, a set of nodes is taken
offline if, after balancing (any gain counts), every instance is on an online node and
every node can still take ``target_resources`` × the policy's standard instance. If the
cluster lacks even ``minimal_resources`` × that instance, it proposes standby nodes
(tagged ``htools:standby:``) to bring online instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import types as T
from .cluster import GCluster
from .hbal import HbalOptions, MoveStep, balance
from .instance import NO_NODE, Instance
from .node import Node

STANDBY_TAG_PREFIX = "htools:standby:"


@dataclass(slots=True)
class SqueezeResult:
    action: str  # "offline", "online" or "none"
    nodes: list[str]
    moves: list[MoveStep] = field(default_factory=list)
    cluster: GCluster | None = None

    def to_dict(self) -> dict:
        return {
            "action": self.action,
            "nodes": self.nodes,
            "moves": [m.to_dict() for m in self.moves],
        }


def _instance_from_spec(factor: float, spec: T.ISpec) -> Instance:
    return Instance(
        "targetInstance",
        math.floor(factor * spec.mem),
        0,
        math.floor(factor * spec.cpu),
        "running",
        False,
        NO_NODE,
        NO_NODE,
        "ext",
        [],
        math.floor(factor * spec.spindle_use),
        [],
    )


def _with_offline(cluster: GCluster, idxs, offline: bool) -> GCluster:
    nodes = list(cluster.nodes)
    for i in idxs:
        node = nodes[i].copy()
        node.offline = offline
        nodes[i] = node
    return cluster.replaced(nodes, cluster.instances)


_BALANCE = HbalOptions(min_gain=0.0, min_gain_limit=0.0, min_score=-math.inf)


def _settle(cluster: GCluster, idxs, offline: bool):
    """Mark nodes offline/online, then balance with any gain accepted."""
    changed = _with_offline(cluster, idxs, offline)
    result = balance(changed, _BALANCE)
    return result.cluster, result.steps


def _capacity_for(inst: Instance, nodes: list[Node]) -> bool:
    for node in nodes:
        try:
            node.add_pri(inst)
        except T.AllocFailure:
            return False
    return True


def _all_on_online(cluster: GCluster) -> bool:
    return all(not cluster.nodes[i.pnode].offline for i in cluster.instances)


def _can_switch(cluster: GCluster, inst: Instance, idxs, offline: bool) -> bool:
    settled, _ = _settle(cluster, idxs, offline)
    return _all_on_online(settled) and _capacity_for(inst, settled.nodes)


def squeeze(cluster: GCluster, target_resources: float = 2.0, minimal_resources: float = 2.0) -> SqueezeResult:
    std = cluster.ipolicy.std
    target = _instance_from_spec(target_resources, std)
    minimal = _instance_from_spec(minimal_resources, std)
    insts = cluster.instances
    candidates = [
        n
        for n in cluster.nodes
        if not n.offline and not n.is_master and not n.slist and not any(insts[i].local_storage for i in n.plist)
    ]
    # htools sorts by primary count, largest first (stable), and decides from the end.
    candidates.sort(key=lambda n: -len(n.plist))
    standby = [n for n in cluster.nodes if n.offline and any(t.startswith(STANDBY_TAG_PREFIX) for t in n.tags)]
    if not _capacity_for(minimal, cluster.nodes):
        chosen = standby
        for k in range(len(standby) + 1):
            if _can_switch(cluster, minimal, [n.idx for n in standby[:k]], offline=False):
                chosen = standby[:k]
                break
        settled, moves = _settle(cluster, [n.idx for n in chosen], offline=False)
        return SqueezeResult("online", [n.name for n in chosen], moves, settled)
    chosen: list[Node] = []
    for node in reversed(candidates):
        trial = [node, *chosen]
        if _can_switch(cluster, target, [n.idx for n in trial], offline=True):
            chosen = trial
    if not chosen:
        return SqueezeResult("none", [], [], cluster)
    settled, moves = _settle(cluster, [n.idx for n in chosen], offline=True)
    return SqueezeResult("offline", [n.name for n in chosen], moves, settled)
