"""Capacity planning: how many more instances fit — Ganeti's hspace, same answers.

Contract: `run_hspace(cluster, HSpaceOptions(...))` runs hspace 3.0's two allocations from
the same start — *tiered* (start at a spec, shrink the resource that fails most, go on) and
*standard* (a fixed spec until the first refusal) — with hail's placement rule and, unless
disabled, the global N+1 capacity check after each placement. `HSpaceResult.hts_lines()`
prints hspace's ``--machine-readable`` keys in hspace's order; `summary()` its human text.

The control flow mirrors htools (including its "big step" speed-up for capacity checks and
its way of choosing what to shrink), because those details decide the exact counts.
"""

from __future__ import annotations

from . import types as T
from .allocation import AllocError, AllocOptions, AllocSolution, any_fit, gen_alloc_nodes, refusals, try_alloc
from .cluster import GCluster
from .hsformat import hts_lines, show_double
from .instance import Instance, shrink
from .metrics import score
from .n_plus_one import Refuter, redundant
from .records import Frozen, Record, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from .node import Node

FailMode = T.FailMode
FailStats = list[tuple[FailMode, int]]
_set = object.__setattr__


class Spec(Frozen):
    """An instance spec as hspace takes it on the command line: ``DISK,MEM,CPU[,SPN]``."""

    __slots__ = ("disk", "mem", "cpu", "spindles")

    def __init__(self, disk: int, mem: int, cpu: int, spindles: int = 1) -> None:
        _set(self, "disk", disk)
        _set(self, "mem", mem)
        _set(self, "cpu", cpu)
        _set(self, "spindles", spindles)

    @classmethod
    def parse(cls, text: str) -> Spec:
        from .simulate import parse_unit

        parts = text.split(",")
        if not 3 <= len(parts) <= 4:
            raise ValueError(f"Invalid specification: '{text}', expected disk,ram,cpu")

        def integer(part: str, what: str) -> int:
            try:
                return int(part)
            except ValueError:
                raise ValueError(f"{what}: cannot parse '{part}' as an integer in '{text}'") from None

        spn = integer(parts[3], "spindles") if len(parts) == 4 else 1
        spec = cls(parse_unit(parts[0]), parse_unit(parts[1]), integer(parts[2], "CPUs"), spn)
        # htools runs (or divides by zero) on sizes below one unit; refuse them up front.
        for value, what in ((spec.disk, "disk"), (spec.mem, "memory"), (spec.cpu, "CPUs"), (spn, "spindles")):
            if value < 1:
                raise ValueError(f"{what} must be at least 1, got {value} in '{text}'")
        return spec

    @classmethod
    def from_ispec(cls, ispec: T.ISpec) -> Spec:
        return cls(ispec.disk, ispec.mem, ispec.cpu, ispec.spindle_use)


class HSpaceOptions(Frozen):
    __slots__ = (
        "disk_template",
        "tiered",
        "standard",
        "capacity",
        "spindle_use",
        "max_length",
        "accept_existing",
        "independent_groups",
        "offline",
        "max_cpu",
        "min_disk",
        "exact",
    )

    def __init__(
        self,
        disk_template: str | None = None,  # None: the cluster policy's first template
        tiered: Spec | None = None,  # None: each min/max pair's max spec
        standard: Spec | None = None,  # None: the policy's std spec
        capacity: bool = True,
        spindle_use: int | None = None,
        max_length: int = -1,
        accept_existing: bool = False,
        independent_groups: bool = False,
        offline: tuple[str, ...] = (),
        max_cpu: float | None = None,
        min_disk: float | None = None,
        exact: bool = True,  # rank by htools' two-pass scores (near ties re-scored exactly)
    ) -> None:
        values = (
            disk_template,
            tiered,
            standard,
            capacity,
            spindle_use,
            max_length,
            accept_existing,
            independent_groups,
            offline,
            max_cpu,
            min_disk,
            exact,
        )
        for name, value in zip(self.__slots__, values, strict=True):
            _set(self, name, value)


class CStats(Record):
    __slots__ = (
        "fmem",
        "fdsk",
        "fspn",
        "amem",
        "adsk",
        "acpu",
        "mmem",
        "mdsk",
        "mcpu",
        "imem",
        "idsk",
        "ispn",
        "icpu",
        "tmem",
        "tdsk",
        "tspn",
        "tcpu",
        "vcpu",
        "ncpu",
        "xmem",
        "nmem",
        "score",
        "ninst",
    )

    def __init__(self, **values) -> None:
        for name in self.__slots__:
            setattr(self, name, values.pop(name, 0.0 if name in _FLOAT_STATS else 0))
        if values:
            raise TypeError(f"CStats has no field {next(iter(values))!r}")

    def efficiency(self) -> dict[str, float]:
        return {
            "memory": self.imem / self.tmem,
            "disk": self.idsk / self.tdsk,
            "vcpu": self.icpu / self.vcpu,
            "spindles": self.ispn / self.tspn,
        }


_FLOAT_STATS = frozenset({"tmem", "tdsk", "tspn", "tcpu", "ncpu", "score"})


def total_resources(nodes: Sequence[Node]) -> CStats:
    cs = CStats()
    for n in nodes:
        free = n.unallocated_mem
        amem = max(0, free - n.r_mem)
        cs.fmem += free
        cs.fdsk += n.f_dsk
        cs.fspn += n.f_spindles
        cs.amem += amem
        cs.adsk += n.avail_disk
        cs.acpu += n.avail_cpu
        cs.mmem = max(cs.mmem, amem)
        cs.mdsk = max(cs.mdsk, n.avail_disk)
        cs.mcpu = max(cs.mcpu, n.avail_cpu)
        cs.imem += n.i_mem
        cs.idsk += int(n.t_dsk) - n.f_dsk
        cs.ispn += n.t_spindles - n.f_spindles
        cs.icpu += n.u_cpu
        cs.tmem += n.t_mem
        cs.tdsk += n.t_dsk
        cs.tspn += n.t_spindles
        cs.tcpu += n.t_cpu
        cs.vcpu += n.hi_cpu
        cs.ncpu += n.u_cpu / n.vcpu_ratio
        cs.xmem += n.x_mem
        cs.nmem += n.n_mem
        cs.ninst += len(n.plist)
    cs.score = score(nodes)
    return cs


def _stats_pairs(kind: str, cs: CStats) -> list[tuple[str, str]]:
    eff = cs.efficiency()
    return [
        (f"{kind}_SCORE", f"{cs.score:.8f}"),
        (f"{kind}_INST_CNT", str(cs.ninst)),
        (f"{kind}_MEM_FREE", str(cs.fmem)),
        (f"{kind}_MEM_AVAIL", str(cs.amem)),
        (f"{kind}_MEM_RESVD", str(cs.fmem - cs.amem)),
        (f"{kind}_MEM_INST", str(cs.imem)),
        (f"{kind}_MEM_OVERHEAD", str(cs.xmem + cs.nmem)),
        (f"{kind}_MEM_EFF", f"{eff['memory']:.8f}"),
        (f"{kind}_DSK_FREE", str(cs.fdsk)),
        (f"{kind}_DSK_AVAIL", str(cs.adsk)),
        (f"{kind}_DSK_RESVD", str(cs.fdsk - cs.adsk)),
        (f"{kind}_DSK_INST", str(cs.idsk)),
        (f"{kind}_DSK_EFF", f"{eff['disk']:.8f}"),
        (f"{kind}_SPN_FREE", str(cs.fspn)),
        (f"{kind}_SPN_INST", str(cs.ispn)),
        (f"{kind}_SPN_EFF", f"{eff['spindles']:.8f}"),
        (f"{kind}_CPU_INST", str(cs.icpu)),
        (f"{kind}_CPU_EFF", f"{eff['vcpu']:.8f}"),
        (f"{kind}_MNODE_MEM_AVAIL", str(cs.mmem)),
        (f"{kind}_MNODE_DSK_AVAIL", str(cs.mdsk)),
    ]


# ---------------------------------------------------------------------- allocation loops


class AllocRun(Record):
    """What an allocation loop returns: failure stats of the last refusal, the cluster,
    and the instances placed (oldest first)."""

    __slots__ = ("failures", "cluster", "placed")

    def __init__(self, failures: FailStats, cluster: GCluster, placed: list[Instance] | None = None) -> None:
        self.failures = failures
        self.cluster = cluster
        self.placed = [] if placed is None else placed


class _Allocator:
    def __init__(self, opts: AllocOptions, alloc_nodes, requires: int) -> None:
        self.opts = opts
        self.alloc_nodes = alloc_nodes
        self.requires = requires
        #: With capacity checks, `iterate` places a batch, and when the batch breaks N+1
        #: places again from the same state in smaller batches, then one by one: the same
        #: placements, recomputed. (cluster id, placed so far, options, shape) -> (the
        #: chain of placements of that shape from that state, position in it).
        self._chains: dict[tuple, tuple[_Chain, int]] = {}
        self._tails: dict[tuple, int] = {}  # (options, shape) -> its number in `_chains`' keys
        #: id of a cluster state -> (the state, whether it is N+1 redundant): `iterate`
        #: asks again about the same state at every shrink step of a tier (states are
        #: never changed in place; each is held, so its id stays its own).
        self._redundant: dict[int, tuple[GCluster, bool]] = {}

    def try_alloc(self, opts: AllocOptions, cluster: GCluster, inst: Instance) -> AllocSolution:
        # Each candidate's state is new, and asked about once: nothing to remember.
        n1 = (lambda cl: redundant(cl, accept_existing=opts.accept_existing, remember=False)) if opts.capacity else None
        return try_alloc(opts, cluster, inst, self.alloc_nodes, n1, two_nodes=self.requires == 2)

    def redundant(self, cluster: GCluster) -> bool:
        found = self._redundant.get(id(cluster))
        if found is None:
            answer = redundant(cluster, accept_existing=self.opts.accept_existing)
            found = self._redundant[id(cluster)] = (cluster, answer)
        return found[1]

    def small_steps(self, opts, run: AllocRun, limit: int | None, template: Instance) -> AllocRun:
        """`iterateAllocSmallStep`: place copies of ``template`` until refused or limit."""
        if template.disk_template == "drbd":
            opts = AllocOptions(
                False,
                opts.ignore_soft_errors,
                opts.restrict_to_nodes,
                opts.accept_existing,
                opts.exact,
            )
        cluster, placed = run.cluster, list(run.placed)
        chain, k, tail = None, 0, None
        if self.opts.capacity:  # see `_chains`; without capacity checks nothing repeats
            # Numbered once per call: hashing the options and the shape at every placement
            # cost more than the rest of the key.
            tail = self._tails.setdefault((opts, _shape(template)), len(self._tails))
            chain, k = self._chains.get((id(cluster), len(placed), tail), (None, 0))
            if chain is None or chain.states[k] is not cluster:
                chain, k = _Chain(cluster), 0
                self._chains[(id(cluster), len(placed), tail)] = (chain, 0)
        while True:
            if chain is not None and k < len(chain.attempts):
                sol = chain.attempts[k]
            else:
                inst = template.copy()
                inst.name = f"new-{len(placed)}"
                inst.idx = len(cluster.instances)
                sol = self.try_alloc(opts, cluster, inst)
                if chain is not None:
                    chain.attempts.append(sol)
            if sol.solution is None or limit == 0:
                return AllocRun(sol.failure_stats(), cluster, placed)
            if chain is None:
                cluster = sol.solution.apply(cluster)
            else:
                k += 1
                if k == len(chain.states):
                    chain.states.append(sol.solution.apply(cluster))
                    self._chains[(id(chain.states[k]), len(placed) + 1, tail)] = (chain, k)
                cluster = chain.states[k]
            placed.append(sol.solution.inst)
            if limit is not None:
                limit -= 1

    def iterate(self, run: AllocRun, limit: int | None, template: Instance, huge=True) -> AllocRun:
        """`iterateAlloc`: with capacity checks, place big batches unchecked and verify
        N+1 once per batch, falling back to checked single steps when a batch fails."""
        opts = self.opts
        if self.requires == 1 and _REFUSED_OUTRIGHT[0]:
            refused = refusals(opts, run.cluster, template, self.alloc_nodes)
            if refused is not None:  # fits nowhere: every way below ends in this refusal
                return AllocRun(AllocSolution(refused).failure_stats(), run.cluster, list(run.placed))
        if not opts.capacity:
            return self.small_steps(opts, run, limit, template)
        while True:
            step = _guess_bigstep(run.cluster.nodes, template) if huge else 10
            if limit is None:
                batch_limit, rest = step, None
            else:
                batch_limit, rest = min(step, limit), max(0, limit - step)
            unchecked = AllocOptions(
                False,
                opts.ignore_soft_errors,
                opts.restrict_to_nodes,
                opts.accept_existing,
                opts.exact,
            )
            res = self.small_steps(unchecked, run, batch_limit, template)
            if self.redundant(res.cluster):
                if rest == 0 or len(res.placed) == len(run.placed):
                    return res
                run, limit = res, rest
                continue
            if huge:
                huge = False
                continue
            return self.small_steps(opts, run, limit, template)

    def alloc_fn(self, cluster: GCluster) -> Callable[[Instance], AllocSolution]:
        """`tryAlloc` on one cluster state, remembered per instance shape: the big-step
        pass walks every level's shrink chain, and each chain ends in the next level's
        (the same sizes on the same cluster), which made the pass quadratic in the chain's
        length (34,000 allocations for 250 levels on 20 nodes; now one per size)."""
        seen: dict[tuple, AllocSolution] = {}
        # Only whether something fits, and the failure modes, are read of these answers
        # (`_suffices_shrinking`), not which candidate wins: near ties need no exact score,
        # and single-node candidates no score at all (`any_fit`).
        o = self.opts
        opts = AllocOptions(o.capacity, o.ignore_soft_errors, o.restrict_to_nodes, o.accept_existing, exact=False)
        unscored = self.requires == 1 and _ANY_FIT[0]
        n1 = refute = None
        if o.capacity:
            n1 = lambda cl: redundant(cl, accept_existing=o.accept_existing, remember=False)  # noqa: E731
            if _REFUTE[0]:
                refute = Refuter(cluster, o.accept_existing)

        def fn(inst: Instance) -> AllocSolution:
            key = _shape(inst)
            found = seen.get(key)
            if found is not None:
                return found
            inst = inst.copy()
            inst.idx = len(cluster.instances)
            try:
                if unscored:
                    found = any_fit(opts, cluster, inst, self.alloc_nodes, n1, refute)
                else:
                    found = self.try_alloc(opts, cluster, inst)
            except AllocError:
                found = AllocSolution()
            seen[key] = found
            return found

        return fn

    def tiered(self, run: AllocRun, limit: int | None, template: Instance) -> AllocRun:
        """`tieredAlloc`, unrolled. After each tier, shrink the spec one unit in the
        resource that failed most, while nothing fits; when the shrink chain ends without
        a fit, try, deepest spec first, each failure mode (least frequent first, as
        measured against hspace 3.0.2) for the first shrunk size that allocates ("big
        steps"). Limits count in total, as in
        htools."""
        res = self.iterate(run, limit, template)
        while True:
            if limit is not None and limit <= len(res.placed):
                return res
            new_limit = None if limit is None else limit - len(res.placed)
            levels = [(template, res.failures, new_limit)]
            progressed = None
            spec, failures, level_limit = template, res.failures, new_limit
            while True:
                smaller = shrink(spec, _most_frequent(failures))
                if smaller is None:
                    break
                attempt = self.iterate(res, level_limit, smaller)
                if len(attempt.placed) > len(res.placed):
                    progressed = (attempt, level_limit, smaller)
                    break
                if level_limit is not None and level_limit <= len(res.placed):
                    break
                spec, failures = smaller, attempt.failures
                level_limit = None if level_limit is None else level_limit - len(res.placed)
                levels.append((spec, failures, level_limit))
            if progressed is not None:
                res, limit, template = progressed
                continue
            alloc = self.alloc_fn(res.cluster)
            for spec, failures, level_limit in reversed(levels):
                modes = [m for m, _ in sorted(failures, key=lambda fm: fm[1])]
                big = None
                for mode in modes:
                    big = _suffices_shrinking(alloc, spec, mode)
                    if big is not None:
                        break
                if big is not None:
                    limit, template = level_limit, big
                    res = self.iterate(res, limit, template)
                    break
            else:
                return res


#: `alloc_fn` answers single-node shapes with `any_fit`, refuting candidates without
#: building them (`n_plus_one.Refuter`): tests turn these off to compare.
_ANY_FIT = [True]
_REFUTE = [True]
#: `iterate` answers a shape that fits nowhere from the nodes' checks alone (`refusals`).
_REFUSED_OUTRIGHT = [True]


class _Chain:
    """Placements of one shape, one after the other, from ``states[0]``: ``attempts[k]``
    is the allocation tried on ``states[k]`` (the states are held: their ids key
    `_Allocator._chains`)."""

    __slots__ = ("states", "attempts")

    def __init__(self, start: GCluster) -> None:
        self.states = [start]
        self.attempts: list[AllocSolution] = []


def _shape(inst: Instance) -> tuple:
    """What `try_alloc` reads of a new instance (its name and index aside)."""
    return (
        inst.mem,
        inst.dsk,
        inst.vcpus,
        tuple(inst.disks),
        inst.spindle_use,
        inst.status,
        inst.disk_template,
        inst.auto_balance,
        inst.forthcoming,
        tuple(inst.tags),
        tuple(inst.excl_tags),
    )


def _most_frequent(failures: FailStats) -> FailMode:
    """``last . sortBy (comparing snd)``: the largest count, ties to the later mode."""
    return sorted(failures, key=lambda fm: fm[1])[-1][0] if failures else FailMode.INTERNAL


def _guess_bigstep(nodes: Sequence[Node], inst: Instance) -> int:
    unused = sum(n.f_mem for n in nodes)
    reserved = round(max(n.t_mem for n in nodes))  # Haskell round: half to even, as Python
    guess = (unused - reserved) // inst.mem - len(nodes)
    return 20 if guess < 20 else guess


def _shrinks(inst: Instance, mode: FailMode) -> Iterator[Instance]:
    """`iterateOk (shrinkByType mode) inst`: the instance, then each smaller one (lazily:
    the first fit usually comes long before the minimum)."""
    while inst is not None:
        yield inst
        inst = shrink(inst, mode)


def _suffices_shrinking(alloc, inst: Instance, mode: FailMode) -> Instance | None:
    """First shrink along ``mode`` that allocates, while ``mode`` keeps failing."""
    for cand in _shrinks(inst, mode):
        sol = alloc(cand)
        if sol.solution is not None:
            return cand
        if mode not in sol.failures:
            return None
    return None


# ---------------------------------------------------------------------- the program


class HSpaceError(AllocError):
    """hspace stopped with an error; `lines` are the HTS_ lines it printed before that
    (Ganeti prints the cluster and initial-state keys, then fails with exit code 1), and
    `summary_lines` what its human output printed before that."""

    def __init__(self, message: str, lines: list[str], summary_lines: list[str] | None = None):
        super().__init__(message)
        self.lines = lines
        self.summary_lines = summary_lines or []


def initial_summary(cluster: GCluster, ini: CStats) -> list[str]:
    """The first lines of hspace's human output: the cluster and its initial instances."""
    return [
        f"The cluster has {len(cluster.nodes)} nodes and the following resources:",
        f"  MEM {ini.tmem:.0f}, DSK {ini.tdsk:.0f}, CPU {ini.tcpu:.0f}, VCPU {ini.vcpu}.",
        "There are " + (str(ini.ninst) if ini.ninst else "no") + " initial instances on the cluster.",
    ]


def _initial_pairs(cluster: GCluster, ini: CStats) -> list[tuple[str, str]]:
    pairs = [
        ("CLUSTER_MEM", f"{ini.tmem:.0f}"),
        ("CLUSTER_DSK", f"{ini.tdsk:.0f}"),
        ("CLUSTER_CPU", f"{ini.tcpu:.0f}"),
        ("CLUSTER_VCPU", str(ini.vcpu)),
        ("CLUSTER_SPN", f"{ini.tspn:.0f}"),
        ("CLUSTER_NODES", str(len(cluster.nodes))),
    ]
    return pairs + _stats_pairs("INI", ini)


class HSpaceResult(Record):
    __slots__ = (
        "cluster",
        "disk_template",
        "tiered_spec",
        "standard_spec",
        "initial",
        "tiered_cluster",
        "tiered_placed",
        "tiered_failures",
        "standard_cluster",
        "standard_placed",
        "standard_failures",
    )

    def __init__(
        self,
        cluster: GCluster,
        disk_template: str,
        tiered_spec: Spec,
        standard_spec: Spec,
        initial: CStats,
        tiered_cluster: GCluster,
        tiered_placed: list[Instance],
        tiered_failures: FailStats,
        standard_cluster: GCluster,
        standard_placed: list[Instance],
        standard_failures: FailStats,
    ) -> None:
        self.cluster = cluster
        self.disk_template = disk_template
        self.tiered_spec = tiered_spec
        self.standard_spec = standard_spec
        self.initial = initial
        self.tiered_cluster = tiered_cluster
        self.tiered_placed = tiered_placed
        self.tiered_failures = tiered_failures
        self.standard_cluster = standard_cluster
        self.standard_placed = standard_placed
        self.standard_failures = standard_failures

    @property
    def tiered_counts(self) -> list[tuple[tuple[int, int, int, int], int]]:
        """(mem, dsk, cpu, spn) → count, in allocation order of the tiers."""
        out: list[tuple[tuple[int, int, int, int], int]] = []
        for inst in self.tiered_placed:
            spec = inst.spec()
            if out and out[-1][0] == spec:
                out[-1] = (spec, out[-1][1] + 1)
            else:
                out.append((spec, 1))
        return out

    @property
    def tspec(self) -> str:
        return " ".join(f"{m},{d},{c},{s}={n}" for (m, d, c, s), n in self.tiered_counts)

    @property
    def standard_count(self) -> int:
        return len(self.standard_placed)

    @property
    def fail_reason(self) -> FailMode:
        return _sorted_reasons(self.standard_failures)[0][0]

    def hts_lines(self) -> list[str]:
        ini = self.initial
        pairs = _initial_pairs(self.cluster, ini)
        pairs += _spec_pairs("TSPEC_INI", self.tiered_spec, self.disk_template)
        trl = total_resources(self.tiered_cluster.nodes)
        pairs += _stats_pairs("TRL", trl)
        pairs.append(("TSPEC", self.tspec))
        pairs += _km_pairs(ini, trl)
        pairs += _spec_pairs("SPEC", self.standard_spec, self.disk_template)
        fin = total_resources(self.standard_cluster.nodes)
        num = len(self.cluster.instances)
        total = num + self.standard_count
        if total != fin.ninst:
            # As hspace: forthcoming instances are in its instance list but on no node's
            # primary list, so its machine-readable output stops here.
            raise HSpaceError(f"internal inconsistency, allocated ({total}) != counted ({fin.ninst})", hts_lines(pairs))
        pairs += _stats_pairs("FIN", fin)
        reasons = _sorted_reasons(self.standard_failures)
        pairs += [
            ("ALLOC_USAGE", f"{num / total:.8f}" if total else "NaN"),
            ("ALLOC_INSTANCES", str(self.standard_count)),
            ("ALLOC_FAIL_REASON", reasons[0][0].label.upper()),
        ]
        pairs += [(f"ALLOC_{m.label.upper()}_CNT", str(n)) for m, n in reasons]
        pairs.append(("OK", "1"))
        return hts_lines(pairs)

    def summary(self) -> str:
        lines = initial_summary(self.cluster, self.initial) + [
            "Tiered (initial size) instance spec is:",
            f"  MEM {self.tiered_spec.mem}, DSK {self.tiered_spec.disk}, "
            f"CPU {self.tiered_spec.cpu}, using disk template '{self.disk_template}'.",
            "Tiered allocation results:",
        ]
        if not self.tiered_placed:
            lines.append("  - no instances allocated")
        for (m, d, c, _), n in self.tiered_counts:
            lines.append(f"  - {n:3d} instances of spec MEM {m}, DSK {d}, CPU {c}")
        lines += _result_lines(self.cluster, self.tiered_cluster, _sorted_reasons(self.tiered_failures))
        s = self.standard_spec
        lines += [
            "Standard (fixed-size) instance spec is:",
            f"  MEM {s.mem}, DSK {s.disk}, CPU {s.cpu}, using disk template '{self.disk_template}'.",
            "Normal (fixed-size) allocation results:",
            f"  - {self.standard_count:3d} instances allocated",
        ]
        lines += _result_lines(self.cluster, self.standard_cluster, _sorted_reasons(self.standard_failures))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "disk_template": self.disk_template,
            "tiered": [
                {"mem": m, "disk": d, "cpu": c, "spindles": s, "count": n} for (m, d, c, s), n in self.tiered_counts
            ],
            "tiered_fail_reason": _sorted_reasons(self.tiered_failures)[0][0].label,
            "standard": {"spec": vars_of(self.standard_spec), "count": self.standard_count},
            "standard_fail_reason": self.fail_reason.label,
            "efficiency": {
                "tiered": total_resources(self.tiered_cluster.nodes).efficiency(),
                "standard": total_resources(self.standard_cluster.nodes).efficiency(),
            },
        }


def vars_of(spec: Spec) -> dict:
    return {"disk": spec.disk, "mem": spec.mem, "cpu": spec.cpu, "spindles": spec.spindles}


def _sorted_reasons(failures: FailStats) -> FailStats:
    return sorted(failures, key=lambda fm: -fm[1]) or [(FailMode.INTERNAL, 0)]


def _result_lines(ini: GCluster, fin: GCluster, reasons: FailStats) -> list[str]:
    eff = total_resources(fin.nodes).efficiency()
    return [
        f"  - most likely failure reason: {reasons[0][0].label}",
        f"  - initial cluster score: {score(ini.nodes):.8f}",
        f"  -   final cluster score: {score(fin.nodes):.8f}",
        f"  - memory usage efficiency: {eff['memory'] * 100:5.2f}%",
        f"  -   disk usage efficiency: {eff['disk'] * 100:5.2f}%",
        f"  -   vcpu usage efficiency: {eff['vcpu'] * 100:5.2f}%",
    ]


def _spec_pairs(prefix: str, spec: Spec, template: str) -> list[tuple[str, str]]:
    return [
        (f"{prefix}_MEM", str(spec.mem)),
        (f"{prefix}_DSK", str(spec.disk)),
        (f"{prefix}_CPU", str(spec.cpu)),
        (f"{prefix}_SPN", str(spec.spindles)),
        (f"{prefix}_RQN", str(T.required_nodes(template))),
        (f"{prefix}_DISK_TEMPLATE", template),
    ]


def _km_pairs(ini: CStats, fin: CStats) -> list[tuple[str, str]]:
    rows = {
        "USED": (ini.icpu, ini.ncpu, ini.imem, ini.idsk, ini.ispn),
        "POOL": (
            fin.icpu - ini.icpu,
            fin.ncpu - ini.ncpu,
            fin.imem - ini.imem,
            fin.idsk - ini.idsk,
            fin.ispn - ini.ispn,
        ),
        "UNAV": (
            fin.vcpu - fin.icpu,
            fin.tcpu - fin.ncpu,
            int(fin.tmem) - fin.imem,
            int(fin.tdsk) - fin.idsk,
            int(fin.tspn) - fin.ispn,
        ),
    }
    pairs = []
    for kind, (cpu, npu, mem, dsk, spn) in rows.items():
        pairs += [
            (f"KM_{kind}_CPU", str(cpu)),
            (f"KM_{kind}_NPU", show_double(npu)),
            (f"KM_{kind}_MEM", str(mem)),
            (f"KM_{kind}_DSK", str(dsk)),
            (f"KM_{kind}_SPN", str(spn)),
        ]
    return pairs


def instance_from_spec(spec: Spec, template: str, spindle_use: int) -> Instance:
    """hspace's ``instFromSpec``: one disk of the whole size, running, auto-balanced."""
    inst = Instance(
        "new",
        spec.mem,
        spec.disk,
        spec.cpu,
        "running",
        True,
        -1,
        -1,
        template,
        [],
        spindle_use,
        [(spec.disk, spec.spindles)],
    )
    return inst


def run_hspace(cluster: GCluster, options: HSpaceOptions | None = None) -> HSpaceResult:
    opts = options or HSpaceOptions()
    if opts.offline:
        cluster = cluster.set_offline(opts.offline)
    if opts.max_cpu is not None or opts.min_disk is not None:
        nodes = []
        for n in cluster.nodes:
            n = n.copy()
            if opts.max_cpu is not None:
                n.set_mcpu(opts.max_cpu)
            if opts.min_disk is not None:
                n.set_mdsk(opts.min_disk)
            nodes.append(n)
        cluster = cluster.replaced(nodes, cluster.instances)
    ipol = cluster.ipolicy
    if not ipol.disk_templates:
        raise AllocError("null list of disk templates received from cluster")
    template = opts.disk_template or ipol.disk_templates[0]
    if template not in T.DISK_TEMPLATES:
        raise ValueError(f'Invalid string value for type DiskTemplate: "{template}"')
    spindle_use = opts.spindle_use if opts.spindle_use is not None else ipol.std.spindle_use
    exact = opts.exact
    alloc_opts = AllocOptions(capacity=opts.capacity, accept_existing=opts.accept_existing, exact=exact)
    bad = [n for n in cluster.nodes if not n.offline and n.fail_n1]
    groups = cluster.groups
    if not opts.accept_existing and bad:
        groups = [g if g.idx not in {n.group for n in bad} else _unallocable(g) for g in groups]
    stop = not (opts.accept_existing or (opts.independent_groups and any(g.allocable for g in groups)) or not bad)
    requires = T.required_nodes(template)
    view = GCluster(groups, cluster.nodes, cluster.instances, cluster.tags, ipol, cluster.name)
    try:
        return _allocate_both(cluster, view, opts, alloc_opts, template, spindle_use, requires, stop)
    except AllocError as exc:
        ini = total_resources(cluster.nodes)
        lines = hts_lines(_initial_pairs(cluster, ini))
        raise HSpaceError(str(exc), lines, initial_summary(cluster, ini)) from exc


def _allocate_both(
    cluster: GCluster,
    view: GCluster,
    opts: HSpaceOptions,
    alloc_opts: AllocOptions,
    template: str,
    spindle_use: int,
    requires: int,
    stop: bool,
) -> HSpaceResult:
    """The tiered then the standard allocation, both from the initial cluster."""
    ipol = cluster.ipolicy
    alloc_nodes = gen_alloc_nodes(alloc_opts, view, cluster.nodes, requires, drop_unalloc=True)
    allocator = _Allocator(alloc_opts, alloc_nodes, requires)
    limit = None if opts.max_length == -1 else opts.max_length
    tspecs = [opts.tiered] if opts.tiered else [Spec.from_ispec(hi) for _, hi in ipol.minmax]
    start = AllocRun([], cluster, [])
    if stop:
        tiered = AllocRun([(FailMode.N1, 1)], cluster, [])
    else:
        tiered = start
        for spec in tspecs:
            if limit is not None and limit <= len(tiered.placed):
                break
            sub_limit = None if limit is None else limit - len(tiered.placed)
            tiered = allocator.tiered(tiered, sub_limit, instance_from_spec(spec, template, spindle_use))
    std_spec = opts.standard or Spec.from_ispec(ipol.std)
    if stop:
        standard = AllocRun([(FailMode.N1, 1)], cluster, [])
    else:
        standard = allocator.iterate(start, limit, instance_from_spec(std_spec, template, spindle_use))
    return HSpaceResult(
        cluster,
        template,
        tspecs[0],
        std_spec,
        total_resources(cluster.nodes),
        tiered.cluster,
        tiered.placed,
        tiered.failures,
        standard.cluster,
        standard.placed,
        standard.failures,
    )


def _unallocable(group: T.Group) -> T.Group:
    return replace(group, alloc_policy="unallocable")
