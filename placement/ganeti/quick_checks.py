"""The first checks of `Node.add_pri`, for every node at once, to skip hopeless candidates.

Contract: `primary_failures(nodes, inst, policy_modes)` returns, per node, the `FailMode`
`Node.add_pri(inst)` (strict) would raise at one of its leading checks — memory, disk,
disk I/O budget, N+1 memory, CPU ratio, in that order, after the instance policy — or None
when those pass (or cannot be judged here: exclusive storage, no CPUs, a forthcoming
instance); the caller then
runs `add_pri` itself, which repeats them and does the rest (tags, "forthcoming" values).

Why: hspace's tiered mode shrinks a spec one unit at a time (256 MiB of disk, 64 MiB of
memory) and, between tiers, tries every step on every node; almost all of those attempts
fail on the first check or two. In Python that is a few microseconds and an exception per
node; here it is a few dozen array operations per attempt. The arithmetic is add_pri's:
integer memory, float disk and CPU comparisons, which numpy evaluates identically
(`tests/.../test_vectorised_checks.py` compares the two on generated clusters with
exclusive storage, tags, offline nodes and forthcoming instances).

Below `NUMPY_NODES` nodes the same checks run as one plain loop (`scalar_failures`: no
exception, no copy, no array set-up — cheaper than numpy there, and numpy is then not
imported at all); the tests hold both to add_pri.
"""

from __future__ import annotations

import sys

from . import types as T

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .instance import Instance
    from .node import Node

FailMode = T.FailMode

_FIELDS = (
    "free_base",  # int(t_mem) - n_mem - i_mem - max(0, x_mem): memory left before the instance
    "f_dsk",
    "lo_dsk",
    "excl",
    "inst_spindles",
    "hi_spindles",
    "r_mem",
    "fail_n1",
    "u_cpu",
    "vcpu_ratio",
    "t_cpu",
)


#: From this many nodes on the array version pays (measured: at 30 nodes one numpy call
#: costs more than the plain loop; numpy's import, when not loaded yet, costs ~0.1 s).
NUMPY_NODES = 128


class NodeColumns:
    """The node fields the checks read, one array per field, for one list of nodes."""

    __slots__ = ("nodes", *_FIELDS)

    def __init__(self, nodes: Sequence[Node]) -> None:
        import numpy as np

        self.nodes = list(nodes)  # held, so the ids keying the cache stay theirs
        self.free_base = np.array([int(n.t_mem) - n.n_mem - n.i_mem - max(0, n.x_mem) for n in nodes], dtype=np.int64)
        self.f_dsk = np.array([n.f_dsk for n in nodes], dtype=float)
        self.lo_dsk = np.array([n.lo_dsk for n in nodes], dtype=float)
        self.excl = np.array([n.excl_storage for n in nodes], dtype=bool)
        self.inst_spindles = np.array([n.inst_spindles for n in nodes], dtype=float)
        self.hi_spindles = np.array([n.hi_spindles for n in nodes], dtype=float)
        self.r_mem = np.array([n.r_mem for n in nodes], dtype=np.int64)
        self.fail_n1 = np.array([n.fail_n1 for n in nodes], dtype=bool)
        self.u_cpu = np.array([n.u_cpu for n in nodes], dtype=float)
        self.vcpu_ratio = np.array([n.vcpu_ratio for n in nodes], dtype=float)
        self.t_cpu = np.array([n.t_cpu for n in nodes], dtype=float)


_CACHE: dict[tuple[int, ...], NodeColumns] = {}
_CACHE_SIZE = 8


def columns(nodes: Sequence[Node]) -> NodeColumns:
    """`NodeColumns` for these node objects, cached: hspace asks for the same cluster
    state many times (nodes are replaced, never changed in place, when one is used)."""
    key = tuple(map(id, nodes))
    found = _CACHE.get(key)
    if found is None:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        found = _CACHE[key] = NodeColumns(nodes)
    return found


_MODES = (FailMode.MEM, FailMode.DISK, FailMode.DISK, FailMode.MEM, FailMode.CPU)


def primary_failures(
    nodes: Sequence[Node], inst: Instance, policy_modes: Sequence[FailMode | None]
) -> list[FailMode | None]:
    """Per node, the mode of the first leading check ``add_pri(inst)`` fails, else None."""
    if inst.forthcoming:  # add_pri checks only the forthcoming values: left to it
        return list(policy_modes)
    if len(nodes) < NUMPY_NODES and "numpy" not in sys.modules or len(nodes) < 8:
        return scalar_failures(nodes, inst, policy_modes)
    return numpy_failures(nodes, inst, policy_modes)


def scalar_failures(
    nodes: Sequence[Node], inst: Instance, policy_modes: Sequence[FailMode | None]
) -> list[FailMode | None]:
    """`primary_failures` as one loop (same checks, same order, same arithmetic)."""
    if inst.forthcoming:
        return list(policy_modes)
    mem = inst.mem if inst.uses_memory else 0
    uses_disk = inst.local_storage
    dsk = inst.dsk
    use = inst.spindle_use
    vcpus = 0 if inst.offline else inst.vcpus
    out: list[FailMode | None] = []
    for row, mode in zip(_rows(nodes), policy_modes, strict=True):
        if mode is not None:
            out.append(mode)
            continue
        free_base, f_dsk, lo_dsk, excl, inst_sp, hi_sp, r_mem, fail_n1, u_cpu, ratio, t_cpu = row
        free = free_base - mem
        if free <= 0:
            out.append(FailMode.MEM)
            continue
        if uses_disk:
            new_dsk = f_dsk - dsk
            if new_dsk <= 0 or new_dsk < lo_dsk:
                out.append(FailMode.DISK)
                continue
            if excl:  # a spindle check comes third there: left to add_pri
                out.append(None)
                continue
        if t_cpu == 0:
            out.append(None)
        elif uses_disk and inst_sp + use > hi_sp:
            out.append(FailMode.DISK)
        elif free <= r_mem and not fail_n1:
            out.append(FailMode.MEM)
        elif ratio >= 0 and ratio < (u_cpu + vcpus) / t_cpu:
            out.append(FailMode.CPU)
        else:
            out.append(None)
    return out


_ROWS: dict[tuple[int, ...], tuple[list, list]] = {}


def _rows(nodes: Sequence[Node]) -> list[tuple]:
    """Per node, the fields the checks read (`_FIELDS`), cached like `columns`."""
    key = tuple(map(id, nodes))
    found = _ROWS.get(key)
    if found is None:
        if len(_ROWS) >= _CACHE_SIZE:
            _ROWS.pop(next(iter(_ROWS)))
        rows = [
            (
                int(n.t_mem) - n.n_mem - n.i_mem - max(0, n.x_mem),
                n.f_dsk,
                n.lo_dsk,
                n.excl_storage,
                n.inst_spindles,
                n.hi_spindles,
                n.r_mem,
                n.fail_n1,
                n.u_cpu,
                n.vcpu_ratio,
                n.t_cpu,
            )
            for n in nodes
        ]
        found = _ROWS[key] = (list(nodes), rows)  # the nodes held: their ids key the cache
    return found[1]


def numpy_failures(
    nodes: Sequence[Node], inst: Instance, policy_modes: Sequence[FailMode | None]
) -> list[FailMode | None]:
    """`primary_failures` for every node at once, in numpy."""
    import numpy as np

    if inst.forthcoming:
        return list(policy_modes)
    col = columns(nodes)
    free = col.free_base - (inst.mem if inst.uses_memory else 0)
    uses_disk = inst.local_storage
    new_dsk = col.f_dsk - inst.dsk if uses_disk else col.f_dsk
    new_inst_sp = np.where(col.excl, 0.0, col.inst_spindles + (inst.spindle_use if uses_disk else 0))
    new_ucpu = col.u_cpu + (0 if inst.offline else inst.vcpus)
    with np.errstate(divide="ignore", invalid="ignore"):
        cpu_share = new_ucpu / col.t_cpu
    checks = [
        free <= 0,
        (new_dsk <= 0) | (new_dsk < col.lo_dsk) if uses_disk else np.zeros(len(free), dtype=bool),
        (new_inst_sp > col.hi_spindles) if uses_disk else np.zeros(len(free), dtype=bool),
        (free <= col.r_mem) & ~col.fail_n1,
        (col.vcpu_ratio >= 0) & (col.vcpu_ratio < cpu_share),
    ]
    # Exclusive storage puts a spindle check third, and no CPUs would divide by zero:
    # past the first two checks, such nodes are left to add_pri.
    unsure = (col.excl if uses_disk else np.zeros(len(free), dtype=bool)) | (col.t_cpu == 0)
    first = np.full(len(free), -1)
    for k in range(len(checks) - 1, -1, -1):
        first[checks[k]] = k
    first[(first >= 2) & unsure] = -1
    out: list[FailMode | None] = []
    for mode, k in zip(policy_modes, first.tolist(), strict=True):
        out.append(mode if mode is not None else (None if k < 0 else _MODES[k]))
    return out
