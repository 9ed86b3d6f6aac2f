"""Global N+1 redundancy: could every node fail and its instances live on? (htools 3.0)

Contract: `redundant(cluster)` is true when, for every node, its DRBD primaries can
fail over to their secondaries, its shared-storage instances can move to another node of
its group, and its other instances (plain, file, blockdev) can be re-created on the other
nodes of its group, largest memory first, each on the best-scoring node, soft limits
ignored. hspace and hail check this after each placement unless told not to.
"""

from __future__ import annotations

from . import types as T
from .fast_moves import _Scratch, primary_outcome
from .instance import Instance, outcome_key, policy_verdict
from .metrics import ClusterStats, ColumnStats, ValueRows
from .moves import FAILOVER, FAILOVER_ANY, Move, apply_move

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .cluster import GCluster


def redundant(
    cluster: GCluster, scope: Sequence[int] | None = None, accept_existing: bool = False, remember: bool = True
) -> bool:
    """``accept_existing``: offline nodes are taken as they are (not evacuated).

    Answers are remembered per cluster state: hspace's tiered loops ask again and again
    about the same state (134 checks of 5 states on a 4-node file), and nodes and instances
    are never changed in place once built (every update returns new ones), so the same
    objects mean the same answer. ``remember=False``: a state built for this one question
    (an allocation candidate's), which keying on its every node and instance would only
    slow down."""
    if not remember:
        return _redundant(cluster, scope, accept_existing)
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


class Refuter:
    """``refuter(ndx, inst)``: True when ``cluster`` with ``inst`` added as a primary on
    node ``ndx`` (an allocation candidate's new state) is certainly not N+1 redundant:
    the node whose evacuation failed last (`_redundant` asks it first) could not re-create
    its instances whatever targets it chose (`_outnumbered`). Answered from
    ``cluster`` and ``inst``, without building the new state; False says nothing (ask
    `redundant`). What it reads of the cluster is gathered once per failed node."""

    __slots__ = ("cluster", "accept_existing", "victims")

    def __init__(self, cluster: GCluster, accept_existing: bool = False) -> None:
        self.cluster = cluster
        self.accept_existing = accept_existing
        #: node name -> (its index, its instances, the targets' (index, memory, disk)),
        #: or None where this cannot tell (a node skipped, or moving instances first).
        self.victims: dict[str, tuple | None] = {}

    def __call__(self, ndx: int, inst: Instance) -> bool:
        name = _LAST_FAILED[0]
        try:
            victim = self.victims[name]
        except KeyError:
            victim = self.victims[name] = self._victim(name)
        if victim is None:
            return False
        vdx, mems, dsks, live, targets = victim
        if inst.forthcoming:
            mem = dsk = 0  # its add takes none of what the re-creations check
        else:
            mem = inst.mem if inst.uses_memory else 0
            dsk = inst.dsk if inst.local_storage else 0
            if vdx == ndx:
                if inst.disk_template == "drbd" or inst.disk_template in T.FREELY_MOVABLE:
                    return False  # it would move first
                # The victim's own new instance is one more to re-create.
                mems = sorted([*mems, mem]) if inst.uses_memory else mems
                dsks = sorted([*dsks, dsk]) if inst.local_storage else dsks
                live += 1
        rooms = [(m - mem, d - dsk) if t == ndx else (m, d) for t, m, d in targets]
        return _outnumbered(mems, dsks, live, rooms)

    def _victim(self, name: str) -> tuple | None:
        """``(index, memory and disk of its instances to re-create (sorted), how many,
        the targets' (index, free memory, free disk))`` of the node named ``name``."""
        nodes = self.cluster.nodes
        victim = next((n for n in nodes if n.name == name), None)
        if victim is None or (self.accept_existing and victim.offline):
            return None
        instances = self.cluster.instances
        fixed = [instances[i] for i in victim.plist]
        movable = T.FREELY_MOVABLE
        if any(i.disk_template == "drbd" or i.disk_template in movable for i in fixed):
            return None  # moves come first there
        live = [i for i in fixed if not i.forthcoming]  # a forced forthcoming add checks nothing
        mems = sorted(i.mem for i in live if i.uses_memory)
        dsks = sorted(i.dsk for i in live if i.local_storage)
        targets = [
            (t.idx, t.unallocated_mem, t.f_dsk) for t in nodes if t.group == victim.group and t.idx != victim.idx
        ]
        return victim.idx, mems, dsks, len(live), targets


def _outnumbered(mems: list[int], dsks: list[int], live: int, rooms: list[tuple[int, int]]) -> bool:
    """Whether ``live`` instances to re-create (forced adds), ``mems`` the memory of the
    running ones and ``dsks`` the disk of those with local storage (both sorted), certainly
    cannot all find a target among targets with these ``(free memory, free disk)``.

    Why it is certain: a forced add fails when the target's free memory, or its free disk
    for local storage, would not stay above 0 (other checks only add failures), and
    re-creations only take from the targets. So a target with ``room`` free can end up
    with at most ``(room − 1) // m`` instances of ``m`` or more, and none at all without
    room; when the instances of some size ``m`` or more outnumber what all the targets
    could hold, some instance finds no target, whichever order and targets are chosen."""
    if not live:
        return False
    if all(mem <= 0 for mem, _ in rooms):
        return True
    for values, which in ((mems, 0), (dsks, 1)):
        seen = None
        for k, m in enumerate(values):
            if m <= 0 or m == seen:
                continue
            seen = m
            hold = 0
            for room in rooms:
                if room[which] > 0:
                    hold += (room[which] - 1) // m
            if len(values) - k > hold:
                return True
    return False


def can_evacuate_node(cluster: GCluster, ndx: int, exact: bool = False, base: list | None = None) -> bool:
    """``exact``: score targets with htools' two-pass computation (ties then break on
    the same rounding as htools; slower). ``base``: empty, or the `ColumnStats` of the
    cluster's nodes, filled in for the next call on the same cluster."""
    nodes = list(cluster.nodes)
    instances = cluster.instances
    node = nodes[ndx]
    # htools prepends to a node's primary list: newest first (we append, so reverse).
    drbd, shared, fixed = [], [], []  # indices, indices, instances (the moves leave those)
    movable = T.FREELY_MOVABLE
    for i in reversed(node.plist):
        inst = instances[i]
        template = inst.disk_template
        if template == "drbd":
            drbd.append(i)
        elif template in movable:
            shared.append(i)
        else:
            fixed.append(inst)
    if drbd and not shared and not fixed and _SCRATCH_FAILOVERS[0]:
        return _fail_over_all(nodes, instances, drbd)
    if drbd or shared:
        instances = list(instances)  # moves are committed to it
    try:
        for i in drbd:
            changed, new_inst = apply_move(nodes, instances[i], Move(FAILOVER))
            _commit(nodes, instances, changed, new_inst)
        escape = [n.idx for n in nodes if n.group == node.group and n.idx != ndx]
        group_nodes = [n.idx for n in nodes if n.group == node.group]
        for i in shared:
            if not _evacuate_shared(nodes, instances, instances[i], escape, group_nodes, exact):
                return False
        if fixed and not _room_for(nodes, fixed, escape):
            return False
        return _recreate_all(cluster, nodes, fixed, escape, exact, _Stats(cluster, nodes, base, bool(drbd or shared)))
    except T.AllocFailure:
        return False
    return True


def _fail_over_all(nodes, instances, drbd: list[int]) -> bool:
    """Whether the failovers of the DRBD instances ``drbd`` (a failed node's only
    primaries), one after the other, all succeed — the checks of `apply_move`'s
    ``FAILOVER``s, in their order, replayed on scalar records of the nodes
    (`fast_moves._Scratch`, held to `apply_move` by the tests): nothing after them reads
    the nodes, so none is copied (four per failover). A failover fails exactly when
    `apply_move` raises; the instances' nodes are read from the originals, as each
    failover moves only the instance it moves."""
    scratch: dict[int, _Scratch] = {}
    try:
        for i in drbd:
            inst = instances[i]
            p, s = inst.pnode, inst.snode
            old_p = scratch.get(p)
            if old_p is None:
                old_p = scratch[p] = _Scratch(nodes[p], loads=False)
            old_s = scratch.get(s)
            if old_s is None:
                old_s = scratch[s] = _Scratch(nodes[s], loads=False)
            old_p.remove_pri(inst)
            old_s.remove_sec(inst)
            old_s.add_pri(inst, nodes[p].offline)
            old_p.add_sec(inst, s, False)
    except T.AllocFailure:
        return False
    return True


#: `can_evacuate_node` fails over a node of DRBD primaries only on scalar records
#: (`_fail_over_all`): tests turn it off to compare with the moves built whole.
_SCRATCH_FAILOVERS = [True]


def _recreate_all(cluster: GCluster, nodes, fixed: list[Instance], escape, exact: bool, stats: _Stats) -> bool:
    """Re-create ``fixed`` (a failed node's instances that cannot move) on ``escape``,
    largest memory first, each on the best target; whether all of them found one."""
    # sortBy (flip compare `on` mem) is a stable sort: equal memory keeps list order.
    ordered = sorted(fixed, key=lambda x: -x.mem)
    needs = None if exact else _suffix_needs(cluster, nodes, ordered, escape)
    counting = needs is not None and _COUNT_SHORTCUT[0]
    alike = _alike_from(ordered) if counting else len(ordered)
    largest = _suffix_largest(ordered) if counting else None
    for k, inst in enumerate(ordered):
        if needs is not None and _each_takes(nodes, escape, needs[k]):
            return True  # every target could take all the rest: each re-creation succeeds
        if largest is not None and _hold_as_largest(nodes, escape, largest[k]):
            return True  # room for the rest even were each the largest of them
        if k == alike:  # the rest are alike: whichever targets take them, they fit by count
            return _take_by_count(nodes, escape, ordered[k:])
        last = k == len(ordered) - 1
        if exact:
            if not _recreate_exact(cluster, nodes, inst, escape):
                return False
        elif not _recreate(cluster, nodes, inst, escape, stats, last):
            return False
    return True


def _room_for(nodes, fixed: list[Instance], escape) -> bool:
    """False when the targets cannot hold ``fixed`` even in sum — a necessary condition
    of `_recreate` succeeding for each (a forced add needs free memory and, for local
    storage, free disk left above 0 after it). Most failed checks in hspace's tiered loops
    end here instead of re-creating instance after instance first."""
    if any(nodes[t].excl_storage for t in escape):
        return True  # spindles decide there: left to the re-creation
    # `Instance.uses_memory` and `local_storage`, spelled out: this runs for every node of
    # every state hspace checks, most often to end the check.
    running, local = T.RUNNING_STATES, T.LOCAL_STORAGE
    mem = dsk = 0
    for inst in fixed:
        if not inst.forthcoming:
            if inst.status in running:
                mem += inst.mem
            if inst.disk_template in local:
                dsk += inst.dsk
    room_mem = room_dsk = 0
    for t in escape:
        node = nodes[t]
        room_mem += max(0, node.unallocated_mem - 1)
        room_dsk += max(0, node.f_dsk - 1)
    return mem <= room_mem and dsk <= room_dsk


def _suffix_needs(cluster: GCluster, nodes, ordered: list[Instance], escape) -> list[tuple] | None:
    """Per position ``k``, what ``ordered[k:]`` needs of a target that takes all of it:
    ``(memory, disk, any memory check, any disk check)``; None when that cannot decide
    (no target, exclusive storage, an instance the group's policy refuses).

    Why: a forced add fails only when free memory, or free disk for local storage, would
    not stay above 0 (spindles aside: exclusive storage), both running totals, after the
    instance policy (the same for every target of the group). So once every target could
    take all the instances left by itself, each `_recreate` left succeeds whichever target
    it picks, and the evacuation's answer is yes without scoring them."""
    if not escape or any(nodes[t].excl_storage for t in escape):
        return None
    ipol = cluster.groups[nodes[escape[0]].group].ipolicy
    if any(policy_verdict(i, ipol, False) is not None for i in ordered):
        return None
    out = []
    mem = dsk = 0
    checks_mem = checks_dsk = False
    for inst in reversed(ordered):
        if not inst.forthcoming:  # a forced forthcoming add checks nothing
            checks_mem = True
            if inst.uses_memory:
                mem += inst.mem
            if inst.local_storage:
                checks_dsk = True
                dsk += inst.dsk
        out.append((mem, dsk, checks_mem, checks_dsk))
    out.reverse()
    return out


#: The counting shortcuts (`_take_by_count`, `_hold_as_largest`) in use (a test turns them
#: off to hold them to the re-creations).
_COUNT_SHORTCUT = [True]


def _charge(inst: Instance) -> tuple[int, int, bool] | None:
    """What a forced re-creation of ``inst`` checks and takes of its target: ``(memory,
    disk, disk checked)``; None for a forthcoming instance (its forced add checks nothing
    and takes none of the checked resources)."""
    if inst.forthcoming:
        return None
    local = inst.local_storage
    return (inst.mem if inst.uses_memory else 0, inst.dsk if local else 0, local)


def _alike_from(ordered: list[Instance]) -> int:
    """The start of the longest tail of ``ordered`` whose instances all have the same
    `_charge` (forthcoming ones anywhere in it): ``len(ordered)`` when there is none."""
    start = len(ordered)
    charge = None
    for k in range(len(ordered) - 1, -1, -1):
        c = _charge(ordered[k])
        if c is not None:
            if charge is None:
                charge = c
            elif c != charge:
                break
        start = k
    return start if charge is not None else len(ordered)


def _suffix_largest(ordered: list[Instance]) -> list[tuple[int, int, int, bool]]:
    """Per position ``k``, of ``ordered[k:]`` without the forthcoming instances: how many,
    the largest memory and disk a re-creation checks, and whether any checks disk."""
    out = []
    count = mem = dsk = 0
    local = False
    for inst in reversed(ordered):
        c = _charge(inst)
        if c is not None:
            count += 1
            mem, dsk, local = max(mem, c[0]), max(dsk, c[1]), local or c[2]
        out.append((count, mem, dsk, local))
    out.reverse()
    return out


def _hold_as_largest(nodes, escape, largest: tuple[int, int, int, bool]) -> bool:
    """Whether `_recreate` certainly succeeds for each of the rest, given `_suffix_largest`'s
    ``(count, largest memory, largest disk, any disk checked)`` of them (their group policy
    admits them and no target has exclusive storage: `_suffix_needs`).

    Why: say ``cap(t)`` is how many instances of the largest size target ``t`` could take
    (`_take_by_count`), and the rest number no more than ``Σ cap(t)``. Were some
    re-creation refused, every target would have too little memory (or disk) left for an
    instance no larger than the largest, so less than one largest instance: it would
    hold ``cap(t)`` or more of those already placed (each no larger), and so all of them
    together at least ``Σ cap(t)`` — but fewer than the rest have been placed."""
    count, mem, dsk, local = largest
    return count == 0 or _room_holds(nodes, escape, count, mem, dsk, local)


def _take_by_count(nodes, escape, rest: list[Instance]) -> bool:
    """Whether `_recreate` succeeds for each of ``rest``, instances with one `_charge`
    (forthcoming ones aside), whose group policy admits them (`_suffix_needs`), on targets
    without exclusive storage.

    Why counting decides: a forced add fails only when the target's free memory, or its
    free disk when checked, would not stay above 0. So a target ``t`` can take ``cap(t)``
    more of these and no more, whatever happens on the others, and each re-creation puts
    one on some target that still has room (the score only decides which). All succeed
    exactly when there are no more of them than ``Σ cap(t)``."""
    charge = None
    count = 0
    for inst in rest:
        c = _charge(inst)
        if c is not None:
            charge, count = c, count + 1
    if charge is None:
        return True
    mem, dsk, local = charge
    return _room_holds(nodes, escape, count, mem, dsk, local)


def _room_holds(nodes, escape, count: int, mem: int, dsk: int, local: bool) -> bool:
    """Whether the targets ``escape`` together have room for ``count`` whole instances of
    ``mem`` memory and (``local``: checked) ``dsk`` disk, each target's share counted alone:
    ``cap(t)`` of them fit on ``t`` exactly when its free memory and disk stay above 0."""
    room = 0
    for t in escape:
        node = nodes[t]
        free = node.unallocated_mem
        if free <= 0:
            continue
        cap = count if mem == 0 else (free - 1) // mem  # free − j·mem > 0 for j ≤ cap
        if local:
            if node.f_dsk <= 0:
                continue
            if dsk > 0:
                cap = min(cap, (node.f_dsk - 1) // dsk)
        room += cap
        if room >= count:
            return True
    return False


def _each_takes(nodes, escape, need: tuple) -> bool:
    mem, dsk, checks_mem, checks_dsk = need
    for t in escape:
        node = nodes[t]
        if checks_mem and node.unallocated_mem - mem <= 0:
            return False
        if checks_dsk and node.f_dsk - dsk <= 0:
            return False
    return True


class _Stats:
    """The statistics of ``nodes`` (exactly `ClusterStats.compute`'s), built when a
    re-creation first has two targets to choose from (with one, none is scored), from
    ``base`` when no instance has moved yet: every evacuation of one cluster starts from
    the same."""

    __slots__ = ("cluster", "nodes", "base", "moved", "column")

    def __init__(self, cluster: GCluster, nodes: list, base: list | None, moved: bool) -> None:
        self.cluster, self.nodes, self.base, self.moved = cluster, nodes, base, moved
        self.column: ColumnStats | None = None

    def get(self) -> ColumnStats:
        if self.column is None:
            if self.moved or self.base is None:
                self.column = ColumnStats(self.nodes)
            else:
                if not self.base:
                    self.base.append(ColumnStats(self.cluster.nodes))
                self.column = self.base[0].copy()
        return self.column

    def set(self, pos: int, node) -> None:
        self.nodes[pos] = node
        if self.column is not None:
            self.column.set(pos, node)
        else:
            self.moved = True  # ``nodes`` differ from the cluster's now


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


def _recreate(cluster: GCluster, nodes, inst: Instance, escape, stats: _Stats, last: bool = False) -> bool:
    """Re-create ``inst`` on the best of ``escape`` (allocateOnSingle, soft errors ignored).
    ``last``: nothing is re-created after it, so the target only has to exist.

    Scores come straight from cached per-node values (`fast_moves.primary_outcome`):
    in these evacuations most candidates are near ties, so estimating first would only
    add work; targets with the same values before and after score the same."""
    shape_key = outcome_key(True, inst)
    groups = cluster.groups
    feasible = []
    verdicts: dict[tuple, object] = {}  # per (group, exclusive storage): the targets share one
    for t in escape:
        target = nodes[t]
        where = (target.group, target.excl_storage)
        verdict = verdicts.get(where, verdicts)
        if verdict is verdicts:
            verdict = verdicts[where] = policy_verdict(inst, groups[target.group].ipolicy, target.excl_storage)
        if verdict is not None:
            continue
        after = primary_outcome(target, inst, True, shape_key)
        if after.__class__ is tuple:  # else a FailMode
            feasible.append((t, after))
    if not feasible:
        return False
    if len(feasible) == 1:
        best, values = feasible[0]
    else:
        column = stats.get()
        scores: dict[tuple, float] = {}
        chosen = None
        for t, after in feasible:
            pair = (column.offline[t], id(column.rows[t]), id(after))
            value = scores.get(pair)
            if value is None:
                value = scores[pair] = column.score_replacing(t, after)
            if chosen is None or not (chosen[0] < value):
                chosen = (value, t, after)
        _, best, values = chosen
    if not last:
        new = nodes[best].add_pri(inst, force=True)
        new.score_values = values  # `primary_outcome`'s are the new node's, interned
        stats.set(best, new)
    return True


def _recreate_exact(cluster: GCluster, nodes, inst: Instance, escape) -> bool:
    """`_recreate` with htools' two-pass score for every target."""
    rows = ValueRows(nodes)
    best = None
    for t in escape:
        target = nodes[t]
        if policy_verdict(inst, cluster.groups[target.group].ipolicy, target.excl_storage) is not None:
            continue
        try:
            # add_pri reads the instance's size and index only: no placed copy needed.
            new = target.add_pri(inst, force=True)
        except T.AllocFailure:
            continue
        value = rows.score_with(new)
        if best is None or not (best[0] < value):
            best = (value, t, new)
    if best is None:
        return False
    nodes[best[1]] = best[2]
    return True
