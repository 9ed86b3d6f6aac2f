"""What a move would do to the score terms — computed without building new nodes.

Contract: `move_values(nodes, inst, move, force)` returns ``{node index: values}`` — each
affected node's 20 score-component values (`metrics.node_values`) after the move — or
raises `AllocFailure`, exactly as `moves.apply_move` followed by `node_values` would. It
replays the same add/remove steps on a few scalars per node (`_Scratch`) instead of
copying whole `Node` objects with their instance lists, which is what makes hbal's
candidate evaluation cheap. The adds run the one scalar check (`node.pri_added`,
`node.sec_added`) on the scratch record; `tests/.../test_vectorised_checks.py` checks the
results agree with `apply_move` on generated clusters and moves.
"""

from __future__ import annotations

from . import types as T
from .instance import Instance
from .metrics import intern_values
from .moves import (
    FAILOVER,
    FAILOVER_AND_REPLACE,
    FAILOVER_ANY,
    REPLACE_AND_FAILOVER,
    REPLACE_PRIMARY,
    REPLACE_SECONDARY,
    Move,
)
from .node import Node, pri_added, sec_added
from .node import _free_spindles as _free_sp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Hashable

FailMode = T.FailMode
_LOCAL_STORAGE = T.LOCAL_STORAGE
_RUNNING = T.RUNNING_STATES
_OFFLINE = T.OFFLINE_STATE
_BASE_UTIL = (1.0, 1.0, 1.0, 1.0)


class _Scratch:
    __slots__ = (
        "n",
        "i_mem",
        "f_dsk",
        "f_dsk_forth",
        "u_cpu",
        "u_cpu_forth",
        "f_spindles",
        "f_spindles_forth",
        "inst_spindles",
        "inst_spindles_forth",
        "npri",
        "nsec",
        "peers",
        "r_mem",
        "fail_n1",
        "f_mem_forth",
        "load",
        "load_forth",
        "p_tags",
        "loads",
    )

    def __init__(self, node: Node, loads: bool = True) -> None:
        """``loads=False``: the checks only (`n_plus_one`'s failovers): the dynamic loads,
        which no check reads and only `values` does, are not kept."""
        self.n = node
        self.loads = loads
        self.i_mem = node.i_mem
        self.f_dsk = node.f_dsk
        self.f_dsk_forth = node.f_dsk_forth
        self.u_cpu = node.u_cpu
        self.u_cpu_forth = node.u_cpu_forth
        self.f_spindles = node.f_spindles
        self.f_spindles_forth = node.f_spindles_forth
        self.inst_spindles = node.inst_spindles
        self.inst_spindles_forth = node.inst_spindles_forth
        self.npri = len(node.plist)
        self.nsec = len(node.slist)
        self.peers = node.peers  # copied on first write
        self.r_mem = node.r_mem
        self.fail_n1 = node.fail_n1
        self.f_mem_forth = node.f_mem_forth
        self.load = node.load
        self.load_forth = node.load_forth
        self.p_tags = node.p_tags

    def unallocated(self, i_mem: int) -> int:
        n = self.n
        return int(n.t_mem) - n.n_mem - i_mem - max(0, n.x_mem)

    # -- the four primitives, mirroring Node.add_pri / add_sec / remove_pri / remove_sec --

    def add_pri(self, inst: Instance, force: bool) -> None:
        (
            self.i_mem,
            self.f_dsk,
            self.fail_n1,
            self.u_cpu,
            self.inst_spindles,
            self.f_spindles,
            self.f_mem_forth,
            self.f_dsk_forth,
            self.u_cpu_forth,
            self.inst_spindles_forth,
            self.f_spindles_forth,
        ) = pri_added(self.n, self, inst, force)
        if not inst.forthcoming:
            self.npri += 1
        if self.loads:
            self._shift_loads(inst, True, 1)
        if inst.excl_tags:
            tags = dict(self.p_tags)
            for tag in inst.excl_tags:
                tags[tag] = tags.get(tag, 0) + 1
            self.p_tags = tags

    def add_sec(self, inst: Instance, pdx: int, force: bool) -> None:
        (
            self.f_dsk,
            peem,
            self.fail_n1,
            self.r_mem,
            self.inst_spindles,
            self.f_spindles,
            self.f_dsk_forth,
            self.inst_spindles_forth,
            self.f_spindles_forth,
        ) = sec_added(self.n, self, inst, pdx, force)
        if not inst.forthcoming:
            self.nsec += 1
            peers = dict(self.peers)
            peers[pdx] = peem
            self.peers = peers
        if self.loads:
            self._shift_loads(inst, False, 1)

    def _shift_loads(self, inst: Instance, primary: bool, sign: int) -> None:
        util = inst.extra.get("util") or _BASE_UTIL
        if not inst.forthcoming:
            self.load = _shift(self.load, util, primary, sign)
        self.load_forth = _shift(self.load_forth, util, primary, sign)

    # The removals mirror `Node.remove_pri` / `remove_sec` (no checks, plain accounting).

    def remove_pri(self, inst: Instance) -> None:
        n = self.n
        if self.loads:
            self._shift_loads(inst, True, -1)
        # The instance's properties and, without exclusive storage, `_free_sp` and
        # `_spindle_use` inline, as in `node.pri_added` (the N+1 check removes every
        # instance of a node).
        uses_disk = inst.disk_template in _LOCAL_STORAGE
        online = inst.status != _OFFLINE
        excl = n.excl_storage
        if not inst.forthcoming:
            self.npri -= 1
            self.i_mem -= inst.mem if inst.status in _RUNNING else 0
            self.fail_n1 = self.unallocated(self.i_mem) <= self.r_mem
            if uses_disk:
                self.f_dsk += inst.dsk
            if excl:
                self.f_spindles = _free_sp(n, inst, self.f_spindles, False)
                self.inst_spindles = 0.0
            else:
                self.f_spindles = 0
                if uses_disk:
                    self.inst_spindles -= inst.spindle_use
            if online:
                self.u_cpu -= inst.vcpus
        if uses_disk:
            self.f_dsk_forth += inst.dsk
        if excl:
            self.f_spindles_forth = _free_sp(n, inst, self.f_spindles_forth, False)
            self.inst_spindles_forth = 0.0
        else:
            self.f_spindles_forth = 0
            if uses_disk:
                self.inst_spindles_forth -= inst.spindle_use
        if online:
            self.u_cpu_forth -= inst.vcpus
        if inst.excl_tags:
            tags = dict(self.p_tags)
            for tag in inst.excl_tags:
                count = tags.get(tag, 0)
                if count > 1:
                    tags[tag] = count - 1
                else:
                    tags.pop(tag, None)
            self.p_tags = tags
        self.f_mem_forth += inst.mem

    def remove_sec(self, inst: Instance) -> None:
        n = self.n
        if self.loads:
            self._shift_loads(inst, False, -1)
        uses_disk = inst.disk_template in _LOCAL_STORAGE  # inline, as in `remove_pri`
        excl = n.excl_storage
        if not inst.forthcoming:
            self.nsec -= 1
            if uses_disk:
                self.f_dsk += inst.dsk
            if excl:
                self.f_spindles = _free_sp(n, inst, self.f_spindles, False)
                self.inst_spindles = 0.0
            else:
                self.f_spindles = 0
                if uses_disk:
                    self.inst_spindles -= inst.spindle_use
            pnode = inst.pnode
            old_peem = self.peers.get(pnode, 0)
            new_peem = old_peem - inst.mem if inst.auto_balance and inst.status != _OFFLINE else old_peem
            peers = dict(self.peers)
            if new_peem > 0:
                peers[pnode] = new_peem
            else:
                peers.pop(pnode, None)
            self.peers = peers
            if not old_peem < self.r_mem:
                self.r_mem = max(peers.values(), default=0)
            self.fail_n1 = self.unallocated(self.i_mem) <= self.r_mem
        if uses_disk:
            self.f_dsk_forth += inst.dsk
        if excl:
            self.f_spindles_forth = _free_sp(n, inst, self.f_spindles_forth, False)
            self.inst_spindles_forth = 0.0
        else:
            self.f_spindles_forth = 0
            if uses_disk:
                self.inst_spindles_forth -= inst.spindle_use

    def values(self) -> tuple[float, ...]:
        return _values(
            self.n,
            self.i_mem,
            self.f_dsk,
            self.fail_n1,
            self.u_cpu,
            self.inst_spindles,
            self.f_spindles,
            self.f_mem_forth,
            self.f_dsk_forth,
            self.u_cpu_forth,
            self.inst_spindles_forth,
            self.f_spindles_forth,
            self.r_mem,
            self.npri + self.nsec,
            self.npri,
            self.load,
            self.p_tags,
        )


def _values(
    n: Node,
    i_mem,
    f_dsk,
    fail_n1,
    u_cpu,
    inst_sp,
    f_sp,
    f_mem_forth,
    f_dsk_forth,
    u_cpu_forth,
    inst_sp_forth,
    f_sp_forth,
    r_mem,
    count: int,
    npri: int,
    load,
    tags,
) -> tuple[float, ...]:
    """`metrics.node_values` of node ``n`` with these changing fields (`Node`'s names;
    ``count``: its primaries and secondaries): `_Scratch.values`, and `_single_add`'s
    without a scratch record."""
    t_mem = n.t_mem
    p_rem = r_mem / t_mem
    speed = n.cpu_speed
    hi_sp = n.hi_spindles
    if n.excl_storage:
        t_sp = float(n.t_spindles)
        p_dsk = 1.0 if t_sp == 0 else f_sp / t_sp
        p_dsk_forth = 1.0 if t_sp == 0 else f_sp_forth / t_sp
    else:
        p_dsk = 1.0 if n.t_dsk == 0 else f_dsk / n.t_dsk
        p_dsk_forth = 1.0 if n.t_dsk == 0 else f_dsk_forth / n.t_dsk
    if hi_sp:  # `_ratio` without its calls (hot)
        sp, sp_forth = inst_sp / hi_sp, inst_sp_forth / hi_sp
    else:
        sp, sp_forth = _ratio(inst_sp, hi_sp), _ratio(inst_sp_forth, hi_sp)
    return (
        (int(t_mem) - n.n_mem - i_mem - max(0, n.x_mem)) / t_mem,  # `_Scratch.unallocated`
        p_dsk,
        float(count) if fail_n1 else 0.0,
        p_rem,
        float(count),
        float(npri),
        u_cpu / n.t_cpu / speed,
        load[0],
        load[1],
        load[2],
        load[3],
        float(sum(tags.values()) - len(tags)) if tags else 0.0,
        sp,
        f_mem_forth / t_mem,
        p_dsk_forth,
        u_cpu_forth / n.t_cpu / speed,
        sp_forth,
        0.0,
        0.0,
        p_rem,
    )


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return float("nan") if a == 0 else (float("inf") if a > 0 else float("-inf"))
    return a / b


def _shift(load, util, primary: bool, sign: int):
    if primary:
        return (
            load[0] + sign * util[0],
            load[1] + sign * util[1],
            load[2] + sign * util[2],
            load[3] + sign * util[3],
        )
    return (load[0], load[1], load[2] + sign * util[2], load[3])


def move_values(nodes, inst: Instance, move: Move, force: bool = False):
    """``{node index: values after the move}``, or AllocFailure."""
    p, s = inst.pnode, inst.snode
    kind, t = move.kind, move.target
    if kind == FAILOVER:
        old_p, old_s = _Scratch(nodes[p]), _Scratch(nodes[s])
        old_p.remove_pri(inst)
        old_s.remove_sec(inst)
        old_s.add_pri(inst, nodes[p].offline or force)
        old_p.add_sec(inst, s, False)
        return {p: old_p.values(), s: old_s.values()}
    if kind == FAILOVER_ANY:
        tgt = _Scratch(nodes[t])
        tgt.add_pri(inst, nodes[p].offline or force)
        src = _Scratch(nodes[p])
        src.remove_pri(inst)
        return {p: src.values(), t: tgt.values()}
    if kind == REPLACE_SECONDARY:
        old_s = _Scratch(nodes[s])
        old_s.remove_sec(inst)
        tgt = _Scratch(nodes[t])
        tgt.add_sec(inst, p, nodes[s].offline or force)
        return {t: tgt.values(), s: old_s.values()}
    old_p, old_s, tgt = _Scratch(nodes[p]), _Scratch(nodes[s]), _Scratch(nodes[t])
    old_p.remove_pri(inst)
    old_s.remove_sec(inst)
    if kind == REPLACE_PRIMARY:
        force_p = nodes[p].offline or force
        old_s.add_pri(inst, force_p)
        old_s.remove_pri(inst)
        tgt.add_pri(inst, force_p)
        old_s.add_sec(inst, t, force_p)
        return {t: tgt.values(), p: old_p.values(), s: old_s.values()}
    if kind == REPLACE_AND_FAILOVER:
        tgt.add_pri(inst, False)
        old_p.add_sec(inst, t, nodes[s].offline or force)
        return {t: tgt.values(), p: old_p.values(), s: old_s.values()}
    if kind == FAILOVER_AND_REPLACE:
        force_p = nodes[p].offline or force
        old_s.add_pri(inst, force_p)
        tgt.add_sec(inst, s, force_p)
        return {t: tgt.values(), s: old_s.values(), p: old_p.values()}
    raise ValueError(f"unknown move {kind!r}")


# ---------------------------------------------------------------------- per node
#
# A move changes each node it involves through a fixed sequence of the four primitives,
# and each node's result depends on that node, the instance and a few static flags only
# (never on the other nodes' states). `node_effects` names those sequences, so hbal can
# reuse one node's outcome across every candidate move that shares it until that node
# changes — the difference between re-scoring every touched candidate after each move and
# recomputing only the nodes that changed.

REMOVE_PRI = ("rp",)
REMOVE_SEC = ("rs",)


def _ap(force: bool) -> tuple:
    return ("ap", force)


def _as(peer: int, force: bool) -> tuple:
    return ("as", peer, force)


def node_effects(nodes, inst: Instance, move: Move, force: bool = False) -> list:
    """``[(node index, op sequence)]`` of the move, in `move_values`' order."""
    p, s = inst.pnode, inst.snode
    kind, t = move.kind, move.target
    if kind == FAILOVER:
        return [
            (p, (REMOVE_PRI, _as(s, False))),
            (s, (REMOVE_SEC, _ap(nodes[p].offline or force))),
        ]
    if kind == FAILOVER_ANY:
        return [(p, (REMOVE_PRI,)), (t, (_ap(nodes[p].offline or force),))]
    if kind == REPLACE_SECONDARY:
        return [(t, (_as(p, nodes[s].offline or force),)), (s, (REMOVE_SEC,))]
    force_p = nodes[p].offline or force
    if kind == REPLACE_PRIMARY:
        return [
            (t, (_ap(force_p),)),
            (p, (REMOVE_PRI,)),
            (s, (REMOVE_SEC, _ap(force_p), REMOVE_PRI, _as(t, force_p))),
        ]
    if kind == REPLACE_AND_FAILOVER:
        return [
            (t, (_ap(False),)),
            (p, (REMOVE_PRI, _as(t, nodes[s].offline or force))),
            (s, (REMOVE_SEC,)),
        ]
    if kind == FAILOVER_AND_REPLACE:
        return [
            (t, (_as(s, force_p),)),
            (s, (REMOVE_SEC, _ap(force_p))),
            (p, (REMOVE_PRI,)),
        ]
    raise ValueError(f"unknown move {kind!r}")


def node_values_after(node: Node, inst: Instance, ops: tuple) -> tuple[float, ...]:
    """One node's 20 score values after ``ops`` (see `node_effects`), or AllocFailure."""
    if len(ops) == 1:  # a single add, as allocation asks for every candidate
        return _single_add(node, inst, ops[0])
    scratch = _Scratch(node)
    for op in ops:
        _replay(scratch, inst, op)
    return scratch.values()


def _single_add(n: Node, inst: Instance, op: tuple) -> tuple[float, ...]:
    """`node_values_after` of one op on a node as it is: `_Scratch`'s replay of it, with
    the unchanged fields read from the node itself (the checks take the node for the
    changing fields as well: they have `Node`'s names), without copying them to a scratch
    record first. ``tests/.../test_vectorised_checks.py`` holds it to the replay."""
    name = op[0]
    if name == "ap":
        (
            i_mem,
            f_dsk,
            fail_n1,
            u_cpu,
            inst_sp,
            f_sp,
            f_mem_forth,
            f_dsk_forth,
            u_cpu_forth,
            inst_sp_forth,
            f_sp_forth,
        ) = pri_added(n, n, inst, op[1])
        npri = len(n.plist) if inst.forthcoming else len(n.plist) + 1
        load = n.load if inst.forthcoming else _shift(n.load, inst.extra.get("util") or _BASE_UTIL, True, 1)
        tags = n.p_tags
        if inst.excl_tags:
            tags = dict(tags)
            for tag in inst.excl_tags:
                tags[tag] = tags.get(tag, 0) + 1
        count = npri + len(n.slist)
        return _values(
            n, i_mem, f_dsk, fail_n1, u_cpu, inst_sp, f_sp, f_mem_forth, f_dsk_forth, u_cpu_forth,
            inst_sp_forth, f_sp_forth, n.r_mem, count, npri, load, tags,
        )  # fmt: skip
    if name != "as":  # a removal: no check, the scratch's plain accounting
        scratch = _Scratch(n)
        _replay(scratch, inst, op)
        return scratch.values()
    f_dsk, _, fail_n1, r_mem, inst_sp, f_sp, f_dsk_forth, inst_sp_forth, f_sp_forth = sec_added(
        n, n, inst, op[1], op[2]
    )
    npri = len(n.plist)
    count = npri + len(n.slist) + (0 if inst.forthcoming else 1)
    load = n.load if inst.forthcoming else _shift(n.load, inst.extra.get("util") or _BASE_UTIL, False, 1)
    return _values(
        n, n.i_mem, f_dsk, fail_n1, n.u_cpu, inst_sp, f_sp, n.f_mem_forth, f_dsk_forth,
        n.u_cpu_forth, inst_sp_forth, f_sp_forth, r_mem, count, npri, load, n.p_tags,
    )  # fmt: skip


def primary_outcome(node: Node, inst: Instance, force: bool, key: Hashable):
    """`node_values_after` of adding ``inst`` as a primary (interned), or the `FailMode`
    that add raises — kept on the node under ``key`` (`instance.outcome_key`):
    nodes are never changed once built, and hspace asks about the same node and shape
    again at each placement and in each N+1 check."""
    return _outcome(node, inst, key, (("ap", force),))


def secondary_outcome(node: Node, inst: Instance, pdx: int, key: Hashable, templates: dict | None = None):
    """`primary_outcome` for adding ``inst`` as a secondary of primary ``pdx`` (strict,
    as hspace's pairs add it), kept under the memory ``pdx`` already reserves on the node
    (with ``key``): the add reads ``pdx`` only there (`node.sec_added`'s ``peers``; the
    values after it read no peer), so the secondaries of primaries that reserve as much
    share one outcome.

    ``templates`` (node index -> values): the outcomes on this node for other primaries
    that the caller has seen succeed (filled in here). A new reservation is then finished
    from one (`_finish_secondary`) instead of replaying the add."""
    if not _BY_RESERVATION[0]:
        return _outcome(node, inst, ("primary", pdx, key), (("as", pdx, False),))
    peem = node.peers.get(pdx, 0)
    memo_key = ("reserved", peem, key)
    memo = node.outcomes
    if memo is not None:
        found = memo.get(memo_key)
        if found is not None:
            return found
    if templates is None:
        return _outcome(node, inst, memo_key, (("as", pdx, False),))
    template = templates.get(node.idx)
    if template is None or inst.forthcoming:
        result = _outcome(node, inst, memo_key, (("as", pdx, False),))
        if result.__class__ is tuple:
            templates[node.idx] = result
        return result
    result = _finish_secondary(node, inst, peem, template)
    remember_outcome(node, memo_key, result)
    return result


def _finish_secondary(node: Node, inst: Instance, peem: int, template: tuple):
    """The outcome of the strict add of ``inst`` (not forthcoming) as a secondary whose
    primary already reserves ``peem`` on ``node``, from ``template``, that add's values
    for another primary. Exact, as `node_outcome` reasons: of `node.sec_added`'s checks
    only the N+1 one reads the reservation (the others passed for the template, so they
    pass here), and of the values only the N+1 count and the reserved memory (twice)."""
    needed = inst.mem if inst.uses_sec_mem else 0
    r_mem = max(node.r_mem, peem + needed)
    fail_n1 = node.unallocated_mem <= r_mem
    if fail_n1 and not node.fail_n1:
        return FailMode.MEM
    values = list(template)
    values[N1_COUNT] = float(len(node.plist) + len(node.slist) + 1) if fail_n1 else 0.0
    values[RESERVED] = values[RESERVED_TOTAL] = r_mem / node.t_mem
    return intern_values(tuple(values))


#: `secondary_outcome` keys by the primary's reservation: tests turn it off to compare.
_BY_RESERVATION = [True]


def _outcome(node: Node, inst: Instance, memo_key: tuple, ops: tuple):
    memo = node.outcomes
    if memo is not None:
        found = memo.get(memo_key)
        if found is not None:
            return found
    try:
        result = intern_values(node_values_after(node, inst, ops))
    except T.AllocFailure as exc:
        result = exc.mode
    remember_outcome(node, memo_key, result)
    return result


def remember_outcome(node: Node, key: Hashable, result) -> None:
    memo = node.outcomes
    if memo is None:
        memo = node.outcomes = {}
    elif len(memo) >= 256:
        memo.clear()
    memo[key] = result


def _replay(scratch: _Scratch, inst: Instance, op: tuple) -> None:
    name = op[0]
    if name == "rp":
        scratch.remove_pri(inst)
    elif name == "rs":
        scratch.remove_sec(inst)
    elif name == "ap":
        scratch.add_pri(inst, op[1])
    else:
        scratch.add_sec(inst, op[1], op[2])


#: A peer no node has: its reservation so far is 0.
_NO_PEER = object()

#: Index of the values an N+1 reservation decides (`_Scratch.values`).
N1_COUNT, RESERVED, RESERVED_TOTAL = 2, 3, 19


def node_outcome(node: Node, inst: Instance, ops: tuple) -> tuple[tuple[float, ...] | None, tuple | None]:
    """`node_values_after`, with a trailing add-secondary left open in its peer.

    Returns ``(values, None)``, or ``(None, None)`` when the ops fail. If the last op adds a
    secondary, returns ``(values, peer)`` where ``values`` are computed as if the peer held
    no reservation on the node yet, and ``peer = (r_mem, free_mem, fail_n1, needed,
    strict, count, t_mem)`` finishes the job for a peer already reserving ``peem``: the
    reservation becomes ``max(r_mem, peem + needed)``, the node fails N+1 when ``free_mem``
    is at most that, which a strict add refuses unless ``fail_n1`` already held, and only
    the N1_COUNT/RESERVED/RESERVED_TOTAL values change. The peer is the only input of the
    add that depends on which node it names, so one call serves every target."""
    scratch = _Scratch(node)
    try:
        for op in ops[:-1]:
            _replay(scratch, inst, op)
        last = ops[-1]
        if last[0] != "as" or inst.forthcoming:  # a forthcoming secondary reserves nothing
            _replay(scratch, inst, last)
            return scratch.values(), None
        before = (scratch.r_mem, scratch.unallocated(scratch.i_mem), scratch.fail_n1)
        # The peer check only refuses more as ``peem`` grows: refused here, refused for all.
        scratch.add_sec(inst, _NO_PEER, last[2])
    except T.AllocFailure:
        return None, None
    needed = inst.mem if inst.uses_sec_mem else 0
    count = scratch.npri + scratch.nsec
    return scratch.values(), (*before, needed, not last[2], count, node.t_mem)
