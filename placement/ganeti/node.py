"""A Ganeti node with htools 3.0's resource accounting.

Contract: mirrors `Ganeti.HTools.Node` field for field where placement depends on it.
Updates are functional: `add_pri`, `add_sec`, `remove_pri`, `remove_sec` return a new node
and never touch the old one; a refusal raises `AllocFailure(FailMode)`, in Ganeti's check
order, so failure statistics come out the same.

Accounting, as measured against the 3.0.2 binaries:

- memory: ``unallocated = t_mem − n_mem − i_mem − max(0, x_mem)`` where ``i_mem`` sums the
  running primaries and ``x_mem = t_mem − n_mem − f_mem − i_mem`` (memory unaccounted for at
  load time); a primary needs ``unallocated − mem > 0`` (strictly);
- vCPUs: ``u_cpu`` starts at the node OS's vCPUs and adds every non-offline primary; the
  ratio ``u_cpu / t_cpu`` must stay ≤ the policy's vcpu-ratio;
- disk: ``plain``/``drbd`` charge ``f_dsk`` (drbd on both nodes) and one "spindle use" per
  instance side against ``spindle_ratio × spindles``; other templates charge nothing;
- N+1: a secondary reserves, per primary node, the memory of the instances that would fail
  over to it (``peers``); ``r_mem`` is the largest such reservation.
"""

from __future__ import annotations

import math

from . import types as T
from .instance import Instance

FailMode = T.FailMode
_LOCAL_STORAGE = T.LOCAL_STORAGE
_RUNNING = T.RUNNING_STATES
_OFFLINE = T.OFFLINE_STATE


class Node:
    __slots__ = (
        "name",
        "idx",
        "group",
        "t_mem",
        "n_mem",
        "f_mem",
        "i_mem",
        "x_mem",
        "f_mem_forth",
        "t_dsk",
        "f_dsk",
        "f_dsk_forth",
        "t_cpu",
        "n_cpu",
        "u_cpu",
        "u_cpu_forth",
        "cpu_speed",
        "t_spindles",
        "f_spindles",
        "f_spindles_forth",
        "inst_spindles",
        "inst_spindles_forth",
        "plist",
        "slist",
        "peers",
        "r_mem",
        "fail_n1",
        "offline",
        "is_master",
        "tags",
        "excl_storage",
        "vcpu_ratio",
        "hi_cpu",
        "hi_spindles",
        "m_dsk",
        "lo_dsk",
        "load",
        "load_forth",
        "p_tags",
        "extra",
        "score_values",
        "outcomes",
    )

    def __init__(
        self,
        name: str,
        t_mem: float,
        n_mem: int,
        f_mem: int,
        t_dsk: float,
        f_dsk: int,
        t_cpu: float,
        n_cpu: int = 1,
        offline: bool = False,
        spindles: int = 1,
        free_spindles: int = 0,
        group: int = 0,
        excl_storage: bool = False,
        cpu_speed: float = 1.0,
        tags: list[str] | None = None,
        is_master: bool = False,
    ) -> None:
        self.name = name
        self.idx = -1
        self.group = group
        self.t_mem = float(t_mem)
        self.n_mem = int(n_mem)
        self.f_mem = int(f_mem)
        self.i_mem = 0
        self.x_mem = 0
        self.f_mem_forth = int(f_mem)
        self.t_dsk = float(t_dsk)
        self.f_dsk = int(f_dsk)
        self.f_dsk_forth = int(f_dsk)
        self.t_cpu = float(t_cpu)
        self.n_cpu = int(n_cpu)
        self.u_cpu = int(n_cpu)
        self.u_cpu_forth = int(n_cpu)
        self.cpu_speed = float(cpu_speed)
        self.t_spindles = int(spindles)
        self.f_spindles = int(free_spindles)
        self.f_spindles_forth = int(free_spindles)
        self.inst_spindles = 0.0
        self.inst_spindles_forth = 0.0
        self.plist: list[int] = []
        self.slist: list[int] = []
        self.peers: dict[int, int] = {}
        self.r_mem = 0
        self.fail_n1 = True
        self.offline = bool(offline)
        self.is_master = is_master
        self.tags = list(tags or [])
        self.excl_storage = bool(excl_storage)
        self.m_dsk = 0.0
        self.lo_dsk = 0
        self.load = [0.0, 0.0, 0.0, 0.0]  # cpu, mem, disk, net "dynamic utilisation"
        self.load_forth = [0.0, 0.0, 0.0, 0.0]
        self.p_tags: dict[str, int] = {}
        self.extra: dict = {}
        #: `metrics.node_values`, once asked (nodes are not changed once scored).
        self.score_values: tuple[float, ...] | None = None
        #: Per instance shape, what adding it as a primary gives (allocation's cache).
        self.outcomes: dict | None = None
        self.set_policy(T.DEFAULT_IPOLICY)

    # ------------------------------------------------------------------ setup

    def copy(self) -> Node:
        # Spelled out (not a loop over __slots__): moves copy nodes in hbal's hot loop.
        c = Node.__new__(Node)
        c.name = self.name
        c.idx = self.idx
        c.group = self.group
        c.t_mem = self.t_mem
        c.n_mem = self.n_mem
        c.f_mem = self.f_mem
        c.i_mem = self.i_mem
        c.x_mem = self.x_mem
        c.f_mem_forth = self.f_mem_forth
        c.t_dsk = self.t_dsk
        c.f_dsk = self.f_dsk
        c.f_dsk_forth = self.f_dsk_forth
        c.t_cpu = self.t_cpu
        c.n_cpu = self.n_cpu
        c.u_cpu = self.u_cpu
        c.u_cpu_forth = self.u_cpu_forth
        c.cpu_speed = self.cpu_speed
        c.t_spindles = self.t_spindles
        c.f_spindles = self.f_spindles
        c.f_spindles_forth = self.f_spindles_forth
        c.inst_spindles = self.inst_spindles
        c.inst_spindles_forth = self.inst_spindles_forth
        c.plist = self.plist.copy()
        c.slist = self.slist.copy()
        c.peers = self.peers.copy()
        c.r_mem = self.r_mem
        c.fail_n1 = self.fail_n1
        c.offline = self.offline
        c.is_master = self.is_master
        c.tags = self.tags
        c.excl_storage = self.excl_storage
        c.vcpu_ratio = self.vcpu_ratio
        c.hi_cpu = self.hi_cpu
        c.hi_spindles = self.hi_spindles
        c.m_dsk = self.m_dsk
        c.lo_dsk = self.lo_dsk
        c.load = self.load.copy()
        c.load_forth = self.load_forth.copy()
        c.p_tags = self.p_tags.copy() if self.p_tags else {}
        c.extra = self.extra
        c.score_values = None
        c.outcomes = None
        return c

    def set_policy(self, ipol: T.IPolicy) -> None:
        self.vcpu_ratio = ipol.vcpu_ratio
        self.hi_cpu = math.floor(ipol.vcpu_ratio * self.t_cpu)
        self.hi_spindles = ipol.spindle_ratio * self.t_spindles

    def set_mdsk(self, ratio: float) -> None:
        self.m_dsk = ratio
        self.lo_dsk = math.floor(ratio * self.t_dsk)

    def set_mcpu(self, ratio: float) -> None:
        self.vcpu_ratio = ratio
        self.hi_cpu = math.floor(ratio * self.t_cpu)

    # ------------------------------------------------------------------ derived values

    @property
    def unallocated_mem(self) -> int:
        return int(self.t_mem) - self.n_mem - self.i_mem - max(0, self.x_mem)

    @property
    def avail_mem(self) -> int:
        return max(0, self.unallocated_mem - self.r_mem)

    @property
    def avail_disk(self) -> int:
        return 0 if self.f_dsk < self.lo_dsk else self.f_dsk - self.lo_dsk

    @property
    def avail_cpu(self) -> int:
        return self.hi_cpu - self.u_cpu if self.hi_cpu >= self.u_cpu else 0

    @property
    def p_mem(self) -> float:
        return self.unallocated_mem / self.t_mem

    @property
    def p_mem_forth(self) -> float:
        return self.f_mem_forth / self.t_mem

    @property
    def p_dsk(self) -> float:
        if self.excl_storage:
            return _pdsk(self.f_spindles, float(self.t_spindles))
        return _pdsk(self.f_dsk, self.t_dsk)

    @property
    def p_dsk_forth(self) -> float:
        if self.excl_storage:
            return _pdsk(self.f_spindles_forth, float(self.t_spindles))
        return _pdsk(self.f_dsk_forth, self.t_dsk)

    @property
    def p_rem(self) -> float:
        return self.r_mem / self.t_mem

    @property
    def p_cpu(self) -> float:
        return self.u_cpu / self.t_cpu

    @property
    def p_cpu_forth(self) -> float:
        return self.u_cpu_forth / self.t_cpu

    def conflicting_primaries(self) -> int:
        return sum(self.p_tags.values()) - len(self.p_tags)

    # ------------------------------------------------------------------ loading

    def load_primary(self, inst: Instance) -> None:
        """`setPri`: record an existing primary at load time (no checks). A forthcoming
        instance only counts in the forthcoming values (its memory stays in ``x_mem``)."""
        if not inst.forthcoming:
            self.plist.append(inst.idx)
            if not inst.offline:
                self.u_cpu += inst.vcpus
            _add_load(self.load, inst.extra.get("util"), primary=True)
            self.inst_spindles = _spindle_use(self, inst, self.inst_spindles, 1)
        else:
            if inst.local_storage:
                self.f_dsk_forth -= inst.dsk
            self.f_spindles_forth = _free_spindles(self, inst, self.f_spindles_forth, add=True)
        if not inst.offline:
            self.u_cpu_forth += inst.vcpus
        _add_load(self.load_forth, inst.extra.get("util"), primary=True)
        self.inst_spindles_forth = _spindle_use(self, inst, self.inst_spindles_forth, 1)
        for tag in inst.excl_tags:
            self.p_tags[tag] = self.p_tags.get(tag, 0) + 1
        # f_mem (as loaded) holds what real instances use; a forthcoming one is not in it
        # (htools' usesMemory is false for it, measured against hinfo's free_mem_cv_forth).
        if inst.forthcoming or not inst.uses_memory:
            self.f_mem_forth -= inst.mem

    def load_secondary(self, inst: Instance) -> None:
        """`setSec`: record an existing secondary at load time (no checks)."""
        if not inst.forthcoming:
            self.slist.append(inst.idx)
            _add_load(self.load, inst.extra.get("util"), primary=False)
            self.inst_spindles = _spindle_use(self, inst, self.inst_spindles, 1)
        else:
            if inst.local_storage:
                self.f_dsk_forth -= inst.dsk
            self.f_spindles_forth = _free_spindles(self, inst, self.f_spindles_forth, add=True)
        _add_load(self.load_forth, inst.extra.get("util"), primary=False)
        self.inst_spindles_forth = _spindle_use(self, inst, self.inst_spindles_forth, 1)

    def finish_loading(self, instances: list[Instance]) -> None:
        """`buildPeers` plus the memory bookkeeping htools does after loading."""
        self.i_mem = sum(instances[i].mem for i in self.plist if instances[i].uses_memory)
        self.x_mem = int(self.t_mem) - self.n_mem - self.f_mem - self.i_mem
        peers: dict[int, int] = {}
        for i in self.slist:
            inst = instances[i]
            mem = inst.mem if inst.uses_sec_mem and not inst.forthcoming else 0
            peers[inst.pnode] = peers.get(inst.pnode, 0) + mem
        self.peers = {p: m for p, m in peers.items()}
        self.r_mem = max(peers.values(), default=0)
        self.fail_n1 = self.f_mem < self.r_mem

    # ------------------------------------------------------------------ updates

    def add_pri(self, inst: Instance, force: bool = False) -> Node:
        """`addPriEx`: a new node with ``inst`` as primary, or AllocFailure."""
        values = pri_added(self, self, inst, force)
        node = self.copy()
        (
            node.i_mem,
            node.f_dsk,
            node.fail_n1,
            node.u_cpu,
            node.inst_spindles,
            node.f_spindles,
            node.f_mem_forth,
            node.f_dsk_forth,
            node.u_cpu_forth,
            node.inst_spindles_forth,
            node.f_spindles_forth,
        ) = values
        if not inst.forthcoming:
            node.plist.append(inst.idx)
            _add_load(node.load, inst.extra.get("util"), primary=True)
        for tag in inst.excl_tags:
            node.p_tags[tag] = node.p_tags.get(tag, 0) + 1
        _add_load(node.load_forth, inst.extra.get("util"), primary=True)
        return node

    def add_sec(self, inst: Instance, pdx: int, force: bool = False, ignore_disks: bool = False) -> Node:
        """`addSecExEx`: a new node with ``inst`` as secondary (primary on ``pdx``)."""
        values = sec_added(self, self, inst, pdx, force, ignore_disks)
        node = self.copy()
        (
            node.f_dsk,
            peem,
            node.fail_n1,
            node.r_mem,
            node.inst_spindles,
            node.f_spindles,
            node.f_dsk_forth,
            node.inst_spindles_forth,
            node.f_spindles_forth,
        ) = values
        if not inst.forthcoming:
            node.slist.append(inst.idx)
            node.peers[pdx] = peem
            _add_load(node.load, inst.extra.get("util"), primary=False)
        _add_load(node.load_forth, inst.extra.get("util"), primary=False)
        return node

    def remove_pri(self, inst: Instance) -> Node:
        """`removePri`: a new node without ``inst`` as primary (a forthcoming instance
        leaves the forthcoming values only, as it was added)."""
        node = self.copy()
        if not inst.forthcoming:
            node.plist.remove(inst.idx)
            node.i_mem = self.i_mem - (inst.mem if inst.uses_memory else 0)
            node.fail_n1 = node.unallocated_mem <= self.r_mem
            if inst.local_storage:
                node.f_dsk = self.f_dsk + inst.dsk
            node.f_spindles = _free_spindles(self, inst, self.f_spindles, add=False)
            node.inst_spindles = _spindle_use(self, inst, self.inst_spindles, -1)
            if not inst.offline:
                node.u_cpu = self.u_cpu - inst.vcpus
            _add_load(node.load, inst.extra.get("util"), primary=True, sign=-1)
        if inst.local_storage:
            node.f_dsk_forth = self.f_dsk_forth + inst.dsk
        node.f_spindles_forth = _free_spindles(self, inst, self.f_spindles_forth, add=False)
        node.inst_spindles_forth = _spindle_use(self, inst, self.inst_spindles_forth, -1)
        if not inst.offline:
            node.u_cpu_forth = self.u_cpu_forth - inst.vcpus
        _add_load(node.load_forth, inst.extra.get("util"), primary=True, sign=-1)
        for tag in inst.excl_tags:
            count = node.p_tags.get(tag, 0)
            if count > 1:
                node.p_tags[tag] = count - 1
            else:
                node.p_tags.pop(tag, None)
        node.f_mem_forth = self.f_mem_forth + inst.mem
        return node

    def remove_sec(self, inst: Instance) -> Node:
        """`removeSec`: a new node without ``inst`` as secondary."""
        node = self.copy()
        if not inst.forthcoming:
            node.slist.remove(inst.idx)
            if inst.local_storage:
                node.f_dsk = self.f_dsk + inst.dsk
            node.f_spindles = _free_spindles(self, inst, self.f_spindles, add=False)
            node.inst_spindles = _spindle_use(self, inst, self.inst_spindles, -1)
            pnode = inst.pnode
            old_peem = self.peers.get(pnode, 0)
            new_peem = old_peem - inst.mem if inst.uses_sec_mem else old_peem
            if new_peem > 0:
                node.peers[pnode] = new_peem
            else:
                node.peers.pop(pnode, None)
            if not old_peem < self.r_mem:
                node.r_mem = max(node.peers.values(), default=0)
            node.fail_n1 = node.unallocated_mem <= node.r_mem
            _add_load(node.load, inst.extra.get("util"), primary=False, sign=-1)
        if inst.local_storage:
            node.f_dsk_forth = self.f_dsk_forth + inst.dsk
        node.f_spindles_forth = _free_spindles(self, inst, self.f_spindles_forth, add=False)
        node.inst_spindles_forth = _spindle_use(self, inst, self.inst_spindles_forth, -1)
        _add_load(node.load_forth, inst.extra.get("util"), primary=False, sign=-1)
        return node

    def __repr__(self) -> str:
        return (
            f"Node({self.name}, mem {self.unallocated_mem}/{self.t_mem:.0f}, "
            f"dsk {self.f_dsk}/{self.t_dsk:.0f}, cpu {self.u_cpu}/{self.t_cpu:.0f}, "
            f"p{len(self.plist)} s{len(self.slist)}{' offline' if self.offline else ''})"
        )


def _pdsk(free: int, total: float) -> float:
    return 1.0 if total == 0 else free / total


def _spindle_use(node: Node, inst: Instance, current: float, sign: int) -> float:
    if node.excl_storage:
        return 0.0
    if inst.local_storage:
        return current + sign * inst.spindle_use
    return current


def _free_spindles(node: Node, inst: Instance, current: int, add: bool) -> int:
    if not node.excl_storage:
        return 0
    spindles = inst.total_spindles()
    if spindles is None:
        return -1 if add else current
    return current - spindles if add else current + spindles


def _add_load(load: list[float], util, primary: bool, sign: int = 1) -> None:
    """Dynamic utilisation: every instance weighs 1 unless told otherwise (htools' baseUtil);
    a secondary only weighs on disk."""
    if util is None:
        util = _BASE_UTIL
    if primary:  # unrolled: every add and removal of a node's instance runs it
        load[0] += sign * util[0]
        load[1] += sign * util[1]
        load[2] += sign * util[2]
        load[3] += sign * util[3]
    else:
        load[2] += sign * util[2]


_BASE_UTIL = (1.0, 1.0, 1.0, 1.0)


#: What `pri_added` returns, in order: the node fields a primary add sets.
PRI_FIELDS = (
    "i_mem",
    "f_dsk",
    "fail_n1",
    "u_cpu",
    "inst_spindles",
    "f_spindles",
    "f_mem_forth",
    "f_dsk_forth",
    "u_cpu_forth",
    "inst_spindles_forth",
    "f_spindles_forth",
)


def pri_added(n: Node, cur, inst: Instance, force: bool) -> tuple:
    """`addPriEx`'s checks, in its order, and the new values (`PRI_FIELDS`) — the one
    scalar copy of the rule, shared by `Node.add_pri` and `fast_moves`.

    ``n`` gives the fixed fields (sizes, limits, policy); ``cur`` the changing ones under
    their `Node` names (the node itself, or a scratch record of them). Raises
    AllocFailure. A forthcoming instance changes the forthcoming values only."""
    strict = not force
    uses_disk = inst.disk_template in _LOCAL_STORAGE  # the properties, without their calls
    online = inst.status != _OFFLINE
    if inst.forthcoming:
        forth = _pri_forth(n, cur, inst, uses_disk, online)
        if strict:
            _raise_forth(n, forth, uses_disk)
        return (cur.i_mem, cur.f_dsk, cur.fail_n1, cur.u_cpu, cur.inst_spindles, cur.f_spindles, *forth)
    # Each value is computed just before its check: most calls fail early in hspace's loops.
    new_i_mem = cur.i_mem + (inst.mem if inst.status in _RUNNING else 0)  # `uses_memory`
    new_free_mem = int(n.t_mem) - n.n_mem - new_i_mem - max(0, n.x_mem)
    if new_free_mem <= 0:
        raise T.AllocFailure(FailMode.MEM)
    new_dsk = cur.f_dsk - inst.dsk if uses_disk else cur.f_dsk
    if uses_disk and (new_dsk <= 0 or (strict and new_dsk < n.lo_dsk)):
        raise T.AllocFailure(FailMode.DISK)
    if n.excl_storage:
        new_free_sp = _free_spindles(n, inst, cur.f_spindles, add=True)
        if uses_disk and new_free_sp < 0:
            raise T.AllocFailure(FailMode.SPINDLES)
        new_inst_sp = 0.0
    else:  # `_free_spindles` and `_spindle_use` without exclusive storage, inline (hot)
        new_free_sp = 0
        new_inst_sp = cur.inst_spindles + inst.spindle_use if uses_disk else cur.inst_spindles
    if strict and uses_disk and new_inst_sp > n.hi_spindles:
        raise T.AllocFailure(FailMode.DISK)
    new_failn1 = new_free_mem <= cur.r_mem
    if strict and new_failn1 and not cur.fail_n1:
        raise T.AllocFailure(FailMode.MEM)
    new_ucpu = cur.u_cpu + (inst.vcpus if online else 0)
    l_cpu = n.vcpu_ratio
    if strict and l_cpu >= 0 and l_cpu < new_ucpu / n.t_cpu:
        raise T.AllocFailure(FailMode.CPU)
    if strict and inst.excl_tags and any(tag in cur.p_tags for tag in inst.excl_tags):
        raise T.AllocFailure(FailMode.TAGS)
    forth = _pri_forth(n, cur, inst, uses_disk, online)
    if strict:
        _raise_forth(n, forth, uses_disk)
    return (new_i_mem, new_dsk, new_failn1, new_ucpu, new_inst_sp, new_free_sp, *forth)


def _pri_forth(n: Node, cur, inst: Instance, uses_disk: bool, online: bool) -> tuple:
    """The "forthcoming" values after a primary add: the same limits apply to them, and
    can be tighter (e.g. f_mem). Computed after the other checks: most calls fail first."""
    if n.excl_storage:
        inst_sp = 0.0
        free_sp = _free_spindles(n, inst, cur.f_spindles_forth, add=True)
    else:  # as in `pri_added`
        inst_sp = cur.inst_spindles_forth + inst.spindle_use if uses_disk else cur.inst_spindles_forth
        free_sp = 0
    return (
        cur.f_mem_forth - inst.mem,
        cur.f_dsk_forth - inst.dsk if uses_disk else cur.f_dsk_forth,
        cur.u_cpu_forth + (inst.vcpus if online else 0),
        inst_sp,
        free_sp,
    )


def _raise_forth(n: Node, forth: tuple, uses_disk: bool) -> None:
    mem, dsk, ucpu, inst_sp, free_sp = forth
    pcpu = ucpu / n.t_cpu  # first, as before: a node without CPUs raises whatever the checks
    # The checks in their order, inline: every successful add passes them all.
    if mem <= 0:
        raise T.AllocFailure(FailMode.MEM)
    if uses_disk:
        if dsk <= 0 or dsk < n.lo_dsk:
            raise T.AllocFailure(FailMode.DISK)
        if n.excl_storage and free_sp < 0:
            raise T.AllocFailure(FailMode.SPINDLES)
        if inst_sp > n.hi_spindles:
            raise T.AllocFailure(FailMode.DISK)
    if n.vcpu_ratio >= 0 and n.vcpu_ratio < pcpu:
        raise T.AllocFailure(FailMode.CPU)


#: What `sec_added` returns, in order (``peem``: the primary's new reservation here).
SEC_FIELDS = (
    "f_dsk",
    "peem",
    "fail_n1",
    "r_mem",
    "inst_spindles",
    "f_spindles",
    "f_dsk_forth",
    "inst_spindles_forth",
    "f_spindles_forth",
)


def sec_added(n: Node, cur, inst: Instance, pdx, force: bool, ignore_disks: bool = False) -> tuple:
    """`addSecExEx`'s checks, in its order, and the new values (`SEC_FIELDS`); see
    `pri_added`. ``cur`` also gives ``peers``; a forthcoming instance reserves nothing."""
    strict = not force
    needed = inst.mem if inst.auto_balance and inst.status != _OFFLINE else 0  # `uses_sec_mem`
    if inst.forthcoming:
        forth = _sec_forth(n, cur, inst)
        if strict:
            if not inst.has_secondary:
                raise T.AllocFailure(FailMode.DISK)
            _raise_sec_forth(n, cur, forth, needed)
        return (cur.f_dsk, None, cur.fail_n1, cur.r_mem, cur.inst_spindles, cur.f_spindles, *forth)
    new_peem = cur.peers.get(pdx, 0) + needed
    old_mem = int(n.t_mem) - n.n_mem - cur.i_mem - max(0, n.x_mem)
    new_dsk = cur.f_dsk - inst.dsk
    if n.excl_storage:
        new_free_sp = _free_spindles(n, inst, cur.f_spindles, add=True)
        new_inst_sp = 0.0
    else:  # as in `pri_added`
        new_free_sp = 0
        new_inst_sp = (
            cur.inst_spindles + inst.spindle_use if inst.disk_template in _LOCAL_STORAGE else cur.inst_spindles
        )
    new_rmem = cur.r_mem if cur.r_mem >= new_peem else new_peem  # max(), without a call
    new_failn1 = old_mem <= new_rmem
    if inst.disk_template != "drbd":  # `has_secondary`
        raise T.AllocFailure(FailMode.DISK)
    if not ignore_disks and new_dsk <= 0:
        raise T.AllocFailure(FailMode.DISK)
    if strict and new_dsk < n.lo_dsk:
        raise T.AllocFailure(FailMode.DISK)
    if n.excl_storage and new_free_sp < 0:
        raise T.AllocFailure(FailMode.SPINDLES)
    if strict and new_inst_sp > n.hi_spindles:
        raise T.AllocFailure(FailMode.DISK)
    if strict and needed >= old_mem:
        raise T.AllocFailure(FailMode.MEM)
    if strict and new_failn1 and not cur.fail_n1:
        raise T.AllocFailure(FailMode.MEM)
    forth = _sec_forth(n, cur, inst)
    if strict:
        _raise_sec_forth(n, cur, forth, needed)
    return (new_dsk, new_peem, new_failn1, new_rmem, new_inst_sp, new_free_sp, *forth)


def _sec_forth(n: Node, cur, inst: Instance) -> tuple:
    if n.excl_storage:
        return (cur.f_dsk_forth - inst.dsk, 0.0, _free_spindles(n, inst, cur.f_spindles_forth, add=True))
    if inst.disk_template in _LOCAL_STORAGE:  # `_spindle_use`, inline as in `pri_added`
        return (cur.f_dsk_forth - inst.dsk, cur.inst_spindles_forth + inst.spindle_use, 0)
    return (cur.f_dsk_forth - inst.dsk, cur.inst_spindles_forth, 0)


def _raise_sec_forth(n: Node, cur, forth: tuple, needed: int) -> None:
    dsk, inst_sp, free_sp = forth
    if dsk <= 0 or dsk < n.lo_dsk:
        raise T.AllocFailure(FailMode.DISK)
    if n.excl_storage and free_sp < 0:
        raise T.AllocFailure(FailMode.SPINDLES)
    if inst_sp > n.hi_spindles:
        raise T.AllocFailure(FailMode.DISK)
    if needed >= cur.f_mem_forth:
        raise T.AllocFailure(FailMode.MEM)
