"""Global N+1 redundancy: could every node fail and its instances live on? (htools 3.0)

Contract: `redundant(cluster)` is true when, for every node, its DRBD primaries can
fail over to their secondaries, its shared-storage instances can move to another node of
its group, and its other instances (plain, file, blockdev) can be re-created on the other
nodes of its group, largest memory first, each on the best-scoring node, soft limits
ignored. hspace and hail check this after each placement unless told not to.
"""

from __future__ import annotations

from . import types as T
from .fast_moves import node_values_after
from .instance import Instance, check_policy
from .metrics import ClusterStats, ColumnStats, ValueRows
from .moves import FAILOVER, FAILOVER_ANY, Move, apply_move

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .cluster import GCluster


def redundant(cluster: GCluster, scope: Sequence[int] | None = None, accept_existing: bool = False) -> bool:
    """``accept_existing``: offline nodes are taken as they are (not evacuated).

    Answers are remembered per cluster state: hspace's tiered loops ask again and again
    about the same state (134 checks of 5 states on a 4-node file), and nodes and instances
    are never changed in place once built (every update returns new ones), so the same
    objects mean the same answer."""
    key = (
        tuple(map(id, cluster.nodes)),
        tuple(map(id, cluster.instances)),
        id(cluster.groups),
        None if scope is None else tuple(scope),
        accept_existing,
    )
    found = _MEMO.get(key)
    if found is not None and found[0] is cluster.groups:
        return found[3]
    answer = _redundant(cluster, scope, accept_existing)
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    # The objects are held so that their ids, which key the memo, stay theirs.
    _MEMO[key] = (cluster.groups, tuple(cluster.nodes), tuple(cluster.instances), answer)
    return answer


_MEMO: dict[tuple, tuple] = {}
_MEMO_SIZE = 64


def _redundant(cluster: GCluster, scope: Sequence[int] | None, accept_existing: bool) -> bool:
    nodes = cluster.nodes if scope is None else [cluster.nodes[i] for i in scope]
    # The answer is all nodes' answers; the node that failed last time is asked first, as
    # a failing check usually fails again on the next candidate of the same search.
    order = sorted(nodes, key=lambda n: n.name != _LAST_FAILED[0])
    base: list[ColumnStats] = []  # the cluster's statistics, shared by the evacuations
    for node in order:
        if accept_existing and node.offline:
            continue
        if not can_evacuate_node(cluster, node.idx, False, base):
            _LAST_FAILED[0] = node.name
            return False
    return True


_LAST_FAILED = [""]


def can_evacuate_node(cluster: GCluster, ndx: int, exact: bool = False, base: list | None = None) -> bool:
    """``exact``: score targets with htools' two-pass computation (ties then break on
    the same rounding as htools; slower). ``base``: empty, or the `ColumnStats` of the
    cluster's nodes, filled in for the next call on the same cluster."""
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
        if fixed and not _room_for(nodes, [instances[i] for i in fixed], escape):
            return False
        column = None
        # sortBy (flip compare `on` mem) is a stable sort: equal memory keeps list order.
        for inst in sorted((instances[i] for i in fixed), key=lambda x: -x.mem):
            if column is None and not exact:
                column = _start_stats(cluster, nodes, base, moved=bool(drbd or shared))
            if not _recreate(cluster, nodes, instances, inst, escape, exact, column):
                return False
    except T.AllocFailure:
        return False
    return True


def _room_for(nodes, fixed: list[Instance], escape) -> bool:
    """False when the targets cannot hold ``fixed`` even in sum — a necessary condition
    of `_recreate` succeeding for each (a forced add needs free memory and, for local
    storage, free disk left above 0 after it). Most failed checks in hspace's tiered loops
    end here instead of re-creating instance after instance first."""
    if any(nodes[t].excl_storage for t in escape):
        return True  # spindles decide there: left to the re-creation
    fixed = [i for i in fixed if not i.forthcoming]
    mem = sum(i.mem for i in fixed if i.uses_memory)
    dsk = sum(i.dsk for i in fixed if i.local_storage)
    room_mem = room_dsk = 0
    for t in escape:
        node = nodes[t]
        room_mem += max(0, node.unallocated_mem - 1)
        room_dsk += max(0, node.f_dsk - 1)
    return mem <= room_mem and dsk <= room_dsk


def _start_stats(cluster: GCluster, nodes, base: list | None, moved: bool) -> ColumnStats:
    """The statistics of ``nodes`` (exactly `ClusterStats.compute`'s), from ``base`` when
    no instance has moved yet: every evacuation of one cluster starts from the same."""
    if moved or base is None:
        return ColumnStats(nodes)
    if not base:
        base.append(ColumnStats(cluster.nodes))
    return base[0].copy()


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


def _recreate(cluster: GCluster, nodes, instances, inst: Instance, escape, exact, column=None) -> bool:
    """Re-create ``inst`` on the best of ``escape`` (allocateOnSingle, soft errors ignored).

    Exact scores come straight from cached per-node values here: in these evacuations
    most candidates are near ties, so estimating first would only add work."""
    if not exact and column is None:
        column = ColumnStats(nodes)
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
            if rows is not None:
                # add_pri reads the instance's size and index only: no placed copy needed.
                value = rows.score_with(target.add_pri(inst, force=True))
            else:
                # The values without building the node (most targets lose).
                value = column.score_replacing(t, node_values_after(target, inst, _FORCED_ADD))
        except T.AllocFailure:
            continue
        if best is None or not (best[0] < value):
            best = (value, t)
    if best is None:
        return False
    new = nodes[best[1]].add_pri(inst, force=True)
    nodes[best[1]] = new
    if column is not None:
        column.set(best[1], new)
    return True


_FORCED_ADD = (("ap", True),)  # `fast_moves` ops: add as primary, soft limits ignored
