"""Global N+1 redundancy: could every node fail and its instances live on? (htools 3.0)

Contract: `redundant(cluster)` is true when, for every node, its DRBD primaries can
fail over to their secondaries, its shared-storage instances can move to another node of
its group, and its other instances (plain, file, blockdev) can be re-created on the other
nodes of its group, largest memory first, each on the best-scoring node, soft limits
ignored. hspace and hail check this after each placement unless told not to.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import types as T
from .cluster import GCluster
from .instance import Instance, check_policy
from .metrics import ClusterStats, ValueRows
from .moves import FAILOVER, FAILOVER_ANY, Move, apply_move


def redundant(cluster: GCluster, scope: Sequence[int] | None = None, accept_existing: bool = False) -> bool:
    """``accept_existing``: offline nodes are taken as they are (not evacuated)."""
    nodes = cluster.nodes if scope is None else [cluster.nodes[i] for i in scope]
    for node in nodes:
        if accept_existing and node.offline:
            continue
        if not can_evacuate_node(cluster, node.idx, False):
            return False
    return True


def can_evacuate_node(cluster: GCluster, ndx: int, exact: bool = False) -> bool:
    """``exact``: score targets with htools' two-pass computation (ties then break on
    the same rounding as htools; slower)."""
    nodes = list(cluster.nodes)
    instances = list(cluster.instances)
    node = nodes[ndx]
    # htools prepends to a node's primary list: newest first (we append, so reverse).
    primaries = list(reversed(node.plist))
    drbd = [i for i in primaries if instances[i].disk_template == "drbd"]
    others = [i for i in primaries if instances[i].disk_template != "drbd"]
    shared = [i for i in others if instances[i].disk_template in T.FREELY_MOVABLE]
    fixed = [i for i in others if instances[i].disk_template not in T.FREELY_MOVABLE]
    try:
        for i in drbd:
            changed, new_inst = apply_move(nodes, instances[i], Move(FAILOVER))
            _commit(nodes, instances, changed, new_inst)
        escape = [n.idx for n in nodes if n.group == node.group and n.idx != ndx]
        group_nodes = [n.idx for n in nodes if n.group == node.group]
        for i in shared:
            if not _evacuate_shared(nodes, instances, instances[i], escape, group_nodes, exact):
                return False
        # sortBy (flip compare `on` mem) is a stable sort: equal memory keeps list order.
        for inst in sorted((instances[i] for i in fixed), key=lambda x: -x.mem):
            if not _recreate(cluster, nodes, instances, inst, escape, exact):
                return False
    except T.AllocFailure:
        return False
    return True


def _commit(nodes, instances, changed, new_inst) -> None:
    for idx, new in changed.items():
        nodes[idx] = new
    instances[new_inst.idx] = new_inst


def _evacuate_shared(nodes, instances, inst: Instance, escape, group_nodes, exact) -> bool:
    """`evacOneNodeOnly` with FailoverToAny: the best group score wins, ties to the later."""
    stats = None if exact else ClusterStats.compute(nodes[i] for i in group_nodes)
    rows = ValueRows([nodes[i] for i in group_nodes]) if exact else None
    best = None
    for t in escape:
        try:
            changed, new_inst = apply_move(nodes, inst, Move(FAILOVER_ANY, t), force=True)
        except T.AllocFailure:
            continue
        if rows is not None:
            value = rows.score_with(*(new for idx, new in changed.items() if idx in rows.position))
        else:
            st = stats
            for idx, new in changed.items():
                st = st.replace(nodes[idx], new)
            value = st.score()
        if best is None or not (best[0] < value):
            best = (value, changed, new_inst)
    if best is None:
        return False
    _commit(nodes, instances, best[1], best[2])
    return True


def _recreate(cluster: GCluster, nodes, instances, inst: Instance, escape, exact) -> bool:
    """Re-create ``inst`` on the best of ``escape`` (allocateOnSingle, soft errors ignored).

    Exact scores come straight from cached per-node values here: in these evacuations
    most candidates are near ties, so estimating first would only add work."""
    stats = None if exact else ClusterStats.compute(nodes)
    rows = ValueRows(nodes) if exact else None
    best = None
    verdicts: dict[tuple[int, bool], object] = {}  # the policy depends on these only
    for t in escape:
        target = nodes[t]
        key = (target.group, target.excl_storage)
        if key not in verdicts:
            verdicts[key] = check_policy(inst, cluster.groups[key[0]].ipolicy, key[1])
        if verdicts[key] is not None:
            continue
        try:
            # add_pri reads the instance's size and index only: no placed copy needed.
            new = target.add_pri(inst, force=True)
        except T.AllocFailure:
            continue
        value = rows.score_with(new) if rows is not None else stats.replace(target, new).score()
        if best is None or not (best[0] < value):
            best = (value, t, new)
    if best is None:
        return False
    nodes[best[1]] = best[2]
    return True
