"""A Ganeti instance as htools models it.

Contract: mirrors `Ganeti.HTools.Instance` for what placement needs: size, run state,
nodes, disk template, spindle use and tags; plus the predicates htools derives from them.
"""

from __future__ import annotations

from itertools import count

from . import types as T
from .records import Record

NO_NODE = -1


class Instance(Record):
    __slots__ = (
        "name",
        "mem",
        "dsk",
        "vcpus",
        "status",
        "auto_balance",
        "pnode",
        "snode",
        "disk_template",
        "tags",
        "spindle_use",
        "disks",  # per disk (size MiB, spindles or None); text files carry one disk of ``dsk``
        "forthcoming",
        "movable",
        "excl_tags",
        "idx",
        "extra",
    )

    def __init__(
        self,
        name: str,
        mem: int,
        dsk: int,
        vcpus: int,
        status: str = "running",
        auto_balance: bool = True,
        pnode: int = NO_NODE,
        snode: int = NO_NODE,
        disk_template: str = "plain",
        tags: list[str] | None = None,
        spindle_use: int = 1,
        disks: list[tuple[int, int | None]] | None = None,
        forthcoming: bool = False,
        movable: bool = True,
        excl_tags: list[str] | None = None,
        idx: int = -1,
        extra: dict | None = None,
    ) -> None:
        self.name = name
        self.mem = mem
        self.dsk = dsk
        self.vcpus = vcpus
        self.status = status
        self.auto_balance = auto_balance
        self.pnode = pnode
        self.snode = snode
        self.disk_template = disk_template
        self.tags = [] if tags is None else tags
        self.spindle_use = spindle_use
        self.disks = [(dsk, None)] if not disks and disk_template != "diskless" else ([] if disks is None else disks)
        self.forthcoming = forthcoming
        self.movable = movable and disk_template in T.MOVABLE
        self.excl_tags = [] if excl_tags is None else excl_tags
        self.idx = idx
        self.extra = {} if extra is None else extra

    def copy(self) -> Instance:
        # Spelled out (not a loop over __slots__): allocation copies instances in hot loops.
        # Shallow, as before: the lists are never mutated in place once built.
        c = Instance.__new__(Instance)
        c.name = self.name
        c.mem = self.mem
        c.dsk = self.dsk
        c.vcpus = self.vcpus
        c.status = self.status
        c.auto_balance = self.auto_balance
        c.pnode = self.pnode
        c.snode = self.snode
        c.disk_template = self.disk_template
        c.tags = self.tags
        c.spindle_use = self.spindle_use
        c.disks = self.disks
        c.forthcoming = self.forthcoming
        c.movable = self.movable
        c.excl_tags = self.excl_tags
        c.idx = self.idx
        c.extra = self.extra
        return c

    # predicates, as in Ganeti.HTools.Instance

    @property
    def running(self) -> bool:
        return self.status in T.RUNNING_STATES

    @property
    def offline(self) -> bool:
        return self.status == T.OFFLINE_STATE

    @property
    def uses_memory(self) -> bool:
        return self.running

    @property
    def uses_sec_mem(self) -> bool:
        return not self.offline and self.auto_balance

    @property
    def local_storage(self) -> bool:
        return self.disk_template in T.LOCAL_STORAGE

    @property
    def has_secondary(self) -> bool:
        return self.disk_template == "drbd"

    @property
    def mirror(self) -> str:
        return T.mirror_type(self.disk_template)

    def all_nodes(self) -> list[int]:
        return [self.pnode, self.snode] if self.has_secondary else [self.pnode]

    def total_spindles(self) -> int | None:
        total = 0
        for _, spindles in self.disks:
            if spindles is None:
                return None
            total += spindles
        return total

    def spec(self) -> tuple[int, int, int, int]:
        """(mem, dsk, cpu, spindles) — hspace's tiered spec key."""
        spn = self.disks[0][1] if len(self.disks) == 1 and self.disks[0][1] is not None else 0
        return (self.mem, self.dsk, self.vcpus, spn)


def shape(inst: Instance) -> tuple:
    """Everything of an instance that adding it to a node reads (the checks, the new
    values), its name, index and nodes aside: equal shapes, equal outcomes on a node."""
    util = inst.extra.get("util")
    return (
        inst.mem,
        inst.dsk,
        inst.vcpus,
        inst.status,
        inst.auto_balance,
        inst.disk_template,
        inst.spindle_use,
        tuple(inst.disks),
        inst.forthcoming,
        tuple(inst.excl_tags),
        None if util is None else tuple(util),
    )


def outcome_key(force: bool, inst: Instance) -> int:
    """The key of an add's outcome in `Node.outcomes`: ``(force, *shape(inst))``,
    numbered once. Allocation looks a shape up on every candidate node (and, for node
    pairs, once per primary on every secondary): hashing the shape with its nested tuples
    each time cost more than the look-up. Numbers are never reused, so an outcome kept
    under one never answers for another shape, even after the table is emptied."""
    full = (force, *shape(inst))
    found = _OUTCOME_KEYS.get(full)
    if found is None:
        if len(_OUTCOME_KEYS) >= _OUTCOME_KEYS_MAX:
            _OUTCOME_KEYS.clear()
        found = _OUTCOME_KEYS[full] = next(_NEXT_KEY)
    return found


_OUTCOME_KEYS: dict[tuple, int] = {}
_OUTCOME_KEYS_MAX = 10_000
_NEXT_KEY = count()


def check_policy(inst: Instance, ipol: T.IPolicy, excl_storage: bool) -> T.FailMode | None:
    """`instMatchesPolicy`: some min/max pair must admit the instance, and its template."""
    result: T.FailMode | None = T.FailMode.INTERNAL
    for lo, hi in reversed(ipol.minmax):
        # Ganeti folds right from an initial Bad: the first matching pair wins, else the
        # failure of the first pair is reported.
        # FailMode.MEM is 0 (falsy): chain with ``is None``, never with ``or``.
        fail = _compare(inst, lo, -1, excl_storage)
        if fail is None:
            fail = _compare(inst, hi, 1, excl_storage)
        if fail is None:
            result = None
        elif result is not None:
            result = fail
    if result is not None:
        return result
    if inst.disk_template not in ipol.disk_templates:
        return T.FailMode.DISK
    return None


def policy_verdict(inst: Instance, ipol: T.IPolicy, excl: bool) -> T.FailMode | None:
    """`check_policy`, remembered per policy and instance shape: hspace's shrink loops and
    N+1 checks ask about the same few specs again and again."""
    key = (id(ipol), excl, inst.mem, tuple(inst.disks), inst.vcpus, inst.spindle_use, inst.disk_template)
    found = _VERDICTS.get(key)
    if found is None or found[0] is not ipol:
        if len(_VERDICTS) >= 4096:
            _VERDICTS.clear()
        found = _VERDICTS[key] = (ipol, check_policy(inst, ipol, excl))  # ipol held: its id keys
    return found[1]


_VERDICTS: dict[tuple, tuple] = {}


def _compare(inst: Instance, spec: T.ISpec, sign: int, excl: bool) -> T.FailMode | None:
    """``sign=-1``: fail when below ``spec``; ``sign=+1``: fail when above."""

    def bad(value: int, limit: int) -> bool:
        return (value < limit) if sign < 0 else (value > limit)

    if bad(inst.mem, spec.mem):
        return T.FailMode.MEM
    if any(bad(size, spec.disk) for size, _ in inst.disks):
        return T.FailMode.DISK
    if bad(inst.vcpus, spec.cpu):
        return T.FailMode.CPU
    if excl:
        spindles = inst.total_spindles()
        if spindles is None or bad(spindles, spec.spindle_use):
            return T.FailMode.SPINDLES
    elif bad(inst.spindle_use, spec.spindle_use):
        return T.FailMode.SPINDLES
    if inst.disk_template != "diskless" and bad(len(inst.disks), spec.disk_count):
        return T.FailMode.DISKCOUNT
    return None


def shrink(inst: Instance, mode: T.FailMode) -> Instance | None:
    """`shrinkByType`: one unit smaller in the failing resource, or None at the minimum."""
    new = inst.copy()
    if mode == T.FailMode.MEM:
        new.mem = inst.mem - T.UNIT_MEM
        return new if new.mem >= T.UNIT_MEM else None
    if mode == T.FailMode.DISK:
        disks = [(size - T.UNIT_DSK, spn) for size, spn in inst.disks]
        if any(size < T.UNIT_DSK for size, _ in disks):
            return None
        new.disks = disks
        new.dsk = inst.dsk - len(inst.disks) * T.UNIT_DSK
        return new
    if mode == T.FailMode.CPU:
        new.vcpus = inst.vcpus - T.UNIT_CPU
        return new if new.vcpus >= T.UNIT_CPU else None
    if mode == T.FailMode.SPINDLES:
        if len(inst.disks) != 1 or inst.disks[0][1] is None:
            return None
        spn = inst.disks[0][1] - T.UNIT_SPINDLE
        if spn < T.UNIT_SPINDLE:
            return None
        new.disks = [(inst.disks[0][0], spn)]
        return new
    return None
