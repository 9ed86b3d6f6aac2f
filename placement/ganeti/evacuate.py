"""Moving instances off nodes or to other groups (IAllocator node-evacuate, change-group,
relocate), as htools' ``Cluster.Evacuate`` does.

Contract: `node_evacuate(cluster, mode, names)` and `change_group(cluster, names, groups)`
return an `EvacResult`: moved ``(instance, group, nodes)``, failed ``(instance, message)``
and one job (a list of opcodes) per moved instance. The best target is the one leaving the
lowest group score; ties go to the later node, as in htools. Plain and file instances
cannot be relocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import types as T
from .cluster import GCluster
from .instance import Instance
from .metrics import score
from .moves import (
    FAILOVER,
    FAILOVER_ANY,
    REPLACE_SECONDARY,
    Move,
    apply_move,
)

CHANGE_PRIMARY = "primary-only"
CHANGE_SECONDARY = "secondary-only"
CHANGE_ALL = "all"
EVAC_MODES = (CHANGE_PRIMARY, CHANGE_SECONDARY, CHANGE_ALL)


class EvacFailure(Exception):
    pass


@dataclass(slots=True)
class EvacResult:
    moved: list[tuple[str, str, list[str]]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    jobs: list[list[dict]] = field(default_factory=list)
    cluster: GCluster | None = None

    def to_json(self) -> list:
        return [
            [[name, group, nodes] for name, group, nodes in self.moved],
            [[name, msg] for name, msg in self.failed],
            self.jobs,
        ]


class _State:
    def __init__(self, cluster: GCluster) -> None:
        self.cluster = cluster
        self.nodes = list(cluster.nodes)
        self.instances = list(cluster.instances)

    def apply(self, changed: dict, inst: Instance) -> None:
        for idx, node in changed.items():
            self.nodes[idx] = node
        self.instances[inst.idx] = inst

    def group_score(self, gdx: int) -> float:
        return score(n for n in self.nodes if n.group == gdx)


def _opcodes(state: _State, inst: Instance, move: Move) -> list[dict]:
    """`iMoveToJob`: the opcodes executing one move."""
    name = inst.name
    nodes = state.nodes

    def migrate(target: str | None = None) -> dict:
        # Key order as hail prints it; failover for instances that are not running.
        op: dict = {"OP_ID": "OP_INSTANCE_MIGRATE", "instance_name": name}
        if not inst.running:
            op["OP_ID"] = "OP_INSTANCE_FAILOVER"
        if target is not None:
            op["target_node"] = target
        op.update(
            {
                "allow_runtime_changes": False,
                "ignore_ipolicy": False,
                "cleanup": False,
                "allow_failover": True,
                "ignore_hvversions": True,
            }
        )
        return op

    def replace(target: str) -> dict:
        return {
            "OP_ID": "OP_INSTANCE_REPLACE_DISKS",
            "instance_name": name,
            "early_release": False,
            "ignore_ipolicy": False,
            "mode": "replace_new_secondary",
            "disks": [],
            "remote_node": target,
        }

    target = nodes[move.target].name if move.target >= 0 else None
    if move.kind == FAILOVER:
        return [migrate()]
    if move.kind == FAILOVER_ANY:
        return [migrate(target)]
    if move.kind == REPLACE_SECONDARY:
        return [replace(target)]
    raise ValueError(f"unexpected evacuation move {move.kind}")


def _best_single(state: _State, inst: Instance, gdx: int, candidates, kind: str, force: bool):
    """`evacOneNodeOnly`: try each node, keep the lowest group score (ties: later)."""
    best = None
    messages = []
    for t in candidates:
        move = Move(kind, t)
        try:
            changed, new_inst = apply_move(state.nodes, inst, move, force)
        except T.AllocFailure as exc:
            messages.append(f" Node {state.nodes[t].name} failed: {exc.mode.label};")
            continue
        saved = {i: state.nodes[i] for i in changed}
        for i, n in changed.items():
            state.nodes[i] = n
        value = state.group_score(gdx)
        for i, n in saved.items():
            state.nodes[i] = n
        if best is None or not (best[0] < value):
            best = (value, move, changed, new_inst)
    if best is None:
        raise EvacFailure("Can't find any good node:" + "".join(messages))
    _, move, changed, new_inst = best
    ops = _opcodes(state, inst, move)
    state.apply(changed, new_inst)
    return ops


def _evacuate_one(state: _State, inst: Instance, mode: str, gdx: int, avail, force=False):
    template = inst.disk_template
    if template in ("plain", "file"):
        raise EvacFailure(f"Instances of type {template} cannot be relocated")
    if template != "drbd":
        if mode == CHANGE_SECONDARY:
            raise EvacFailure(f"Instances with disk template '{template}' can't execute change secondary")
        return _best_single(state, inst, gdx, avail, FAILOVER_ANY, force)
    if mode == CHANGE_PRIMARY:
        try:
            changed, new_inst = apply_move(state.nodes, inst, Move(FAILOVER), force)
        except T.AllocFailure as exc:
            raise EvacFailure(exc.mode.label) from exc
        ops = _opcodes(state, inst, Move(FAILOVER))
        state.apply(changed, new_inst)
        return ops
    if mode == CHANGE_SECONDARY:
        return _best_single(state, inst, gdx, avail, REPLACE_SECONDARY, force)
    return _change_all_drbd(state, inst, gdx, avail, force)


def _change_all_drbd(state: _State, inst: Instance, gdx: int, avail, force: bool):
    """Every (primary, secondary) pair: r:p, f, r:s; keep the lowest group score."""
    best = None
    last_error = "no nodes available"
    for p in avail:
        for s in avail:
            if p == s:
                continue
            sub = _State(state.cluster)
            sub.nodes, sub.instances = list(state.nodes), list(state.instances)
            moves = [Move(REPLACE_SECONDARY, p), Move(FAILOVER), Move(REPLACE_SECONDARY, s)]
            if sub.nodes[inst.pnode].offline:
                moves.insert(0, Move(FAILOVER))
            cur = inst
            ops: list[dict] = []
            try:
                for mv in moves:
                    ops += _opcodes(sub, cur, mv)
                    changed, cur = apply_move(sub.nodes, cur, mv, force)
                    for i, n in changed.items():
                        sub.nodes[i] = n
            except T.AllocFailure as exc:
                last_error = f"Allocation failed: {exc.mode.label}"
                continue
            value = score(n for n in sub.nodes if n.group == gdx)
            if best is None or not (best[0] < value):
                best = (value, sub.nodes, cur, ops)
    if best is None:
        raise EvacFailure(f"Can't find any good nodes for relocation: {last_error}")
    _, nodes, cur, ops = best
    state.nodes = nodes
    state.instances[cur.idx] = cur
    return ops


def _nodes_to_evacuate(state: _State, mode: str, idxs) -> set[int]:
    out: set[int] = set()
    for i in idxs:
        inst = state.instances[i]
        if mode in (CHANGE_PRIMARY, CHANGE_ALL):
            out.add(inst.pnode)
        if mode in (CHANGE_SECONDARY, CHANGE_ALL) and inst.disk_template == "drbd":
            out.add(inst.snode)
    out.discard(-1)
    return out


def node_evacuate(cluster: GCluster, mode: str, names, force: bool = False) -> EvacResult:
    if mode not in EVAC_MODES:
        raise ValueError(f"invalid evacuation mode {mode!r}")
    state = _State(cluster)
    idxs = [cluster.instance_index(n) for n in names]
    excluded = _nodes_to_evacuate(state, mode, idxs) | {n.idx for n in cluster.nodes if n.offline}
    result = EvacResult()
    for i in idxs:
        inst = state.instances[i]
        gdx = state.nodes[inst.pnode].group
        avail = [n.idx for n in state.nodes if n.group == gdx and n.idx not in excluded and n.idx != inst.pnode]
        try:
            ops = _evacuate_one(state, inst, mode, gdx, avail, force)
        except EvacFailure as exc:
            result.failed.append((inst.name, str(exc)))
            continue
        new = state.instances[i]
        result.moved.append((new.name, cluster.groups[gdx].name, [state.nodes[n].name for n in new.all_nodes()]))
        result.jobs.append(ops)
    result.cluster = cluster.replaced(state.nodes, state.instances)
    return result


def change_group(cluster: GCluster, names, target_groups=()) -> EvacResult:
    """Move instances to the best of ``target_groups`` (default: every other group)."""
    from .allocation import AllocOptions, find_best_alloc_group

    state = _State(cluster)
    idxs = [cluster.instance_index(n) for n in names]
    evac_groups = {state.nodes[state.instances[i].pnode].group for i in idxs}
    targets = [cluster.group_index(g) for g in target_groups] or [g.idx for g in cluster.groups]
    targets = [g for g in targets if g not in evac_groups]
    offline = {n.idx for n in cluster.nodes if n.offline}
    result = EvacResult()
    for i in idxs:
        inst = state.instances[i]
        try:
            view = cluster.replaced(state.nodes, state.instances)
            count = T.required_nodes(inst.disk_template)
            group, _, _ = find_best_alloc_group(AllocOptions(capacity=False), view, inst, count, targets)
            avail = [n.idx for n in state.nodes if n.group == group.idx and n.idx not in offline]
            if not avail:
                raise EvacFailure(f"no available nodes in group {group.name}")
            if inst.disk_template == "drbd":
                ops = _change_all_drbd(state, inst, group.idx, avail, False)
            else:
                ops = _evacuate_one(state, inst, CHANGE_ALL, group.idx, avail)
        except Exception as exc:  # htools reports any failure per instance
            result.failed.append((inst.name, str(exc)))
            continue
        new = state.instances[i]
        result.moved.append((new.name, group.name, [state.nodes[n].name for n in new.all_nodes()]))
        result.jobs.append(ops)
    result.cluster = cluster.replaced(state.nodes, state.instances)
    return result
