"""Instance moves as htools models them (`Ganeti.HTools.Cluster.Moves.applyMoveEx`).

Contract: `apply_move(nodes, inst, move, force)` returns ``(changed, new_inst)`` where
``changed`` maps node index → new node, or raises `AllocFailure`. Nothing is mutated.
Moves (with Ganeti's short names):

- ``f``        Failover: swap primary and secondary (DRBD)
- ``fa:N``     FailoverToAny: migrate to node N (shared storage)
- ``r:N``      ReplaceSecondary: new secondary N (DRBD)
- ``f r:N f``  ReplacePrimary: new primary N, same secondary
- ``r:N f``    ReplaceAndFailover: N becomes primary, the old primary secondary
- ``f r:N``    FailoverAndReplace: old secondary becomes primary, N secondary

Migration tags (``htools:migration:``) are not modelled.
"""

from __future__ import annotations

from .records import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .instance import Instance
    from .node import Node

FAILOVER = "f"
FAILOVER_ANY = "fa"
REPLACE_SECONDARY = "r"
REPLACE_PRIMARY = "frf"
REPLACE_AND_FAILOVER = "rf"
FAILOVER_AND_REPLACE = "fr"

_set = object.__setattr__


class Move(Frozen):
    __slots__ = ("kind", "target")

    def __init__(self, kind: str, target: int = -1) -> None:
        _set(self, "kind", kind)
        _set(self, "target", target)

    def describe(self, target_name: str = "") -> str:
        return {
            FAILOVER: "f",
            FAILOVER_ANY: f"fa:{target_name}",
            REPLACE_SECONDARY: f"r:{target_name}",
            REPLACE_PRIMARY: f"f r:{target_name} f",
            REPLACE_AND_FAILOVER: f"r:{target_name} f",
            FAILOVER_AND_REPLACE: f"f r:{target_name}",
        }[self.kind]


def apply_move(
    nodes: Sequence[Node], inst: Instance, move: Move, force: bool = False
) -> tuple[dict[int, Node], Instance]:
    p, s = inst.pnode, inst.snode
    kind, t = move.kind, move.target
    new_inst = inst.copy()
    if kind == FAILOVER:
        old_p, old_s = nodes[p], nodes[s]
        int_p = old_p.remove_pri(inst)
        int_s = old_s.remove_sec(inst)
        new_p = int_s.add_pri(inst, force=old_p.offline or force)
        new_s = int_p.add_sec(inst, s)
        new_inst.pnode, new_inst.snode = s, p
        return {p: new_s, s: new_p}, new_inst
    if kind == FAILOVER_ANY:
        old_p, tgt = nodes[p], nodes[t]
        new_t = tgt.add_pri(inst, force=old_p.offline or force)
        new_inst.pnode = t
        return {p: old_p.remove_pri(inst), t: new_t}, new_inst
    if kind == REPLACE_SECONDARY:
        old_s = nodes[s]
        int_s = old_s.remove_sec(inst)
        new_s = nodes[t].add_sec(inst, p, force=old_s.offline or force)
        new_inst.snode = t
        return {t: new_s, s: int_s}, new_inst
    old_p, old_s, tgt = nodes[p], nodes[s], nodes[t]
    int_p = old_p.remove_pri(inst)
    int_s = old_s.remove_sec(inst)
    if kind == REPLACE_PRIMARY:
        force_p = old_p.offline or force
        tmp_s = int_s.add_pri(inst, force=force_p).remove_pri(inst)
        new_p = tgt.add_pri(inst, force=force_p)
        new_s = tmp_s.add_sec(inst, t, force=force_p)
        new_inst.pnode = t
        return {t: new_p, p: int_p, s: new_s}, new_inst
    if kind == REPLACE_AND_FAILOVER:
        new_p = tgt.add_pri(inst)
        new_s = int_p.add_sec(inst, t, force=old_s.offline or force)
        new_inst.pnode, new_inst.snode = t, p
        return {t: new_p, p: new_s, s: int_s}, new_inst
    if kind == FAILOVER_AND_REPLACE:
        force_p = old_p.offline or force
        new_p = int_s.add_pri(inst, force=force_p)
        new_s = tgt.add_sec(inst, s, force=force_p)
        new_inst.pnode, new_inst.snode = s, t
        return {t: new_s, s: new_p, p: int_p}, new_inst
    raise ValueError(f"unknown move {kind!r}")


def possible_moves(
    inst: Instance,
    targets: Sequence[int],
    secondary_ok: bool,
    instance_moves: bool = True,
    disk_moves: bool = True,
    restricted_migration: bool = False,
    primary_offline: bool = False,
) -> list[Move]:
    """`checkInstanceMove`'s move list for one instance, in htools' order.

    ``targets`` exclude the instance's own nodes; ``secondary_ok``: its secondary is an
    allowed target (so failing over to it is allowed).
    """
    mirror = inst.mirror
    moves: list[Move] = []
    use_secondary = secondary_ok and instance_moves
    if mirror == "internal" and use_secondary:
        moves.append(Move(FAILOVER))
    if not disk_moves:
        return moves
    for t in targets:
        if mirror == "external":
            if instance_moves:
                moves.append(Move(FAILOVER_ANY, t))
        elif mirror == "internal":
            if not instance_moves or (restricted_migration and not primary_offline):
                moves.append(Move(REPLACE_SECONDARY, t))
            elif use_secondary:
                moves.append(Move(REPLACE_SECONDARY, t))
                moves.append(Move(REPLACE_AND_FAILOVER, t))
                if not restricted_migration:
                    moves.append(Move(REPLACE_PRIMARY, t))
                moves.append(Move(FAILOVER_AND_REPLACE, t))
            else:
                moves.append(Move(REPLACE_SECONDARY, t))
                moves.append(Move(REPLACE_AND_FAILOVER, t))
    return moves
