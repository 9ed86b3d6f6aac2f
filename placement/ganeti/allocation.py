"""hail's allocation rule: score every feasible node (or node pair), lowest score wins.

Contract: mirrors `Ganeti.HTools.Cluster` 3.0 for allocation: `gen_alloc_nodes`,
`try_alloc` (one group or node set), `try_mg_alloc` (best group: preferred before
last_resort, then by score), `try_group_alloc` and `alloc_list` (multi-allocate). Ties go
to the last candidate, as in htools (its candidate list is built in reverse and sorted
stably). With capacity checks on, the best candidate that keeps the cluster globally N+1
redundant wins; dropped candidates count as FailN1.

Candidates are scored incrementally from the cluster statistics (Ganeti's own update rule,
which hail uses for node pairs); ``exact=True`` ranks single-node candidates by the full
two-pass score as htools does — equal to the last bit, since ties break on it — by
re-scoring exactly only the candidates whose incremental scores are near ties.
"""

from __future__ import annotations

import math

from . import types as T
from .fast_moves import primary_outcome, remember_outcome, secondary_outcome
from .instance import NO_NODE, outcome_key, policy_verdict
from .metrics import ClusterStats, node_values, rows_of, score
from .n_plus_one import redundant
from .node import pri_added
from .quick_checks import primary_failures
from .records import Frozen, Record, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .cluster import GCluster
    from .instance import Instance
    from .metrics import ValueRows
    from .node import Node

FailMode = T.FailMode
_set = object.__setattr__


class AllocOptions(Frozen):
    """The subset of htools' AlgorithmOptions that allocation reads."""

    __slots__ = ("capacity", "ignore_soft_errors", "restrict_to_nodes", "accept_existing", "exact")

    def __init__(
        self,
        capacity: bool = True,
        ignore_soft_errors: bool = False,
        restrict_to_nodes: frozenset[str] | None = None,
        accept_existing: bool = False,
        exact: bool = False,
    ) -> None:
        _set(self, "capacity", capacity)
        _set(self, "ignore_soft_errors", ignore_soft_errors)
        _set(self, "restrict_to_nodes", restrict_to_nodes)
        _set(self, "accept_existing", accept_existing)
        _set(self, "exact", exact)


class Candidate(Record):
    """An allocation element: the changed nodes, the placed instance, the score."""

    __slots__ = ("nodes", "inst", "score")

    def __init__(self, nodes: tuple[tuple[int, Node], ...], inst: Instance, score: float) -> None:
        self.nodes = nodes
        self.inst = inst
        self.score = score

    def apply(self, cluster: GCluster) -> GCluster:
        nodes = list(cluster.nodes)
        for idx, node in self.nodes:
            nodes[idx] = node
        instances = list(cluster.instances)
        if 0 <= self.inst.idx < len(instances):
            instances[self.inst.idx] = self.inst
        else:
            self.inst.idx = len(instances)
            instances.append(self.inst)
        return cluster.replaced(nodes, instances)

    def node_names(self) -> list[str]:
        return [node.name for _, node in self.nodes]


class AllocSolution(Record):
    __slots__ = ("failures", "allocs", "solution", "log")

    def __init__(
        self,
        failures: list[FailMode] | None = None,
        allocs: int = 0,
        solution: Candidate | None = None,
        log: list[str] | None = None,
    ) -> None:
        self.failures = [] if failures is None else failures
        self.allocs = allocs
        self.solution = solution
        self.log = [] if log is None else log

    def failure_stats(self) -> list[tuple[FailMode, int]]:
        """`collapseFailures`: a count for every mode, in FailMode order."""
        counts = [0] * len(FailMode)
        for mode in self.failures:
            counts[mode] += 1
        return list(zip(FailMode, counts, strict=True))

    def describe(self) -> str:
        freasons = ", ".join(f"{m.label}: {n}" for m, n in self.failure_stats() if n > 0)
        if self.solution is None:
            return "No valid allocation solutions, failure reasons: " + (
                freasons if self.failures else "unknown reasons"
            )
        names = "/".join(self.solution.node_names())
        return (
            f"score: {self.solution.score:.8f}, successes {self.allocs}, "
            f"failures {len(self.failures)} ({freasons}) for node(s) {names}"
        )


class AllocError(Exception):
    """A request htools would answer with ``Bad``: no online nodes, unknown group, ..."""


# ---------------------------------------------------------------------- primitives


def gen_alloc_nodes(
    opts: AllocOptions, cluster: GCluster, nodes: Sequence[Node], count: int, drop_unalloc: bool
) -> list[int] | list[tuple[int, list[int]]]:
    online = [n for n in nodes if not n.offline]
    if drop_unalloc:
        online = [n for n in online if cluster.groups[n.group].allocable]
    if opts.restrict_to_nodes is not None:
        online = [n for n in online if n.name in opts.restrict_to_nodes]
    if count == 1:
        return [n.idx for n in online]
    if count == 2:
        pairs = [(p.idx, [s.idx for s in online if s.idx != p.idx and s.group == p.group]) for p in online]
        return [(p, ss) for p, ss in pairs if ss]
    raise AllocError("Unsupported number of nodes, only one or two  supported")


def allocate_on_single(
    opts: AllocOptions,
    cluster: GCluster,
    stats: ClusterStats | Callable[[], ClusterStats] | None,
    inst: Instance,
    ndx: int,
    scope: Sequence[int] | None = None,
    policy: Callable[[Node], FailMode | None] | None = None,
    rows: Callable[[], ValueRows] | None = None,
) -> Candidate:
    """``stats=None``: the exact two-pass score (from ``rows`` when given)."""
    node = cluster.nodes[ndx]
    fail = (policy or _policy_check(cluster, inst))(node)
    if fail is not None:
        raise T.AllocFailure(fail)
    # add_pri reads the instance's size and index only, so the copy waits for success
    # (most candidates fail in hspace's shrink loops).
    new = node.add_pri(inst, force=opts.ignore_soft_errors)
    placed = inst.copy()
    placed.pnode, placed.snode = ndx, NO_NODE
    if stats is None and rows is not None:
        value = rows().score_with(new)
    elif stats is None:
        nodes = list(cluster.nodes)
        nodes[ndx] = new
        value = score(nodes if scope is None else [nodes[i] for i in scope])
    else:
        base = stats if isinstance(stats, ClusterStats) else stats()
        value = base.score_replaced(node, new)
    return Candidate(((ndx, new),), placed, value)


def allocate_on_pair(
    opts: AllocOptions,
    cluster: GCluster,
    stats: ClusterStats | Callable[[], ClusterStats],
    inst: Instance,
    p: int,
    s: int,
    policy: Callable[[Node], FailMode | None] | None = None,
) -> Candidate:
    tgt_p, tgt_s = cluster.nodes[p], cluster.nodes[s]
    fail = (policy or _policy_check(cluster, inst))(tgt_p)
    if fail is not None:
        raise T.AllocFailure(fail)
    new_p = tgt_p.add_pri(inst, force=opts.ignore_soft_errors)
    new_s = tgt_s.add_sec(inst, p)
    placed = inst.copy()
    placed.pnode, placed.snode = p, s
    base = stats if isinstance(stats, ClusterStats) else stats()
    value = base.replace(tgt_p, new_p).replace(tgt_s, new_s).score()
    return Candidate(((p, new_p), (s, new_s)), placed, value)


def _policy_check(cluster: GCluster, inst: Instance) -> Callable[[Node], FailMode | None]:
    """The instance-policy verdict per node, computed once per (group, exclusive storage):
    it depends on nothing else, and it is asked for every candidate."""
    verdicts: dict[tuple[int, bool], FailMode | None] = {}

    def check(node: Node) -> FailMode | None:
        key = (node.group, node.excl_storage)
        try:
            return verdicts[key]
        except KeyError:
            verdict = verdicts[key] = policy_verdict(inst, cluster.groups[node.group].ipolicy, node.excl_storage)
            return verdict

    return check


#: Largest possible gap between an incrementally updated score and htools' two-pass one
#: (rounding in Σx² − n·mean², amplified by the square root near zero variance), with a
#: wide margin. Candidates closer than this are re-scored exactly before being ranked.
NEAR_TIE = 1e-5


def _collect(
    candidates: list[Candidate],
    failures: list[FailMode],
    keep: Callable[[Candidate], bool],
    exact: Callable[[list[Candidate]], list[float]] | None = None,
) -> AllocSolution:
    """`collectionToSolution`: best score first, ties to the later candidate.

    With ``exact``, scores are incremental estimates: runs of near-equal ones are
    re-scored exactly and re-ranked, lazily, until a candidate is kept (a candidate
    without a near tie keeps its estimate: hspace, the one caller, never shows it)."""
    # (score, position in the reversed list): a stable sort of the reversed list.
    ordered = sorted(enumerate(reversed(candidates)), key=lambda item: item[1].score)
    dropped = 0
    chosen = None
    i = 0
    while i < len(ordered) and chosen is None:
        j = i + 1
        if exact is not None:
            while j < len(ordered) and ordered[j][1].score - ordered[j - 1][1].score <= NEAR_TIE:
                j += 1
            run = ordered[i:j]
            if j - i > 1:  # alone, its exact score would change nothing
                for (_, cand), value in zip(run, exact([cand for _, cand in run]), strict=True):
                    cand.score = value
                run.sort(key=lambda item: (item[1].score, item[0]))
        else:
            run = ordered[i:j]
        for _, cand in run:
            if keep(cand):
                chosen = cand
                break
            dropped += 1
        i = j
    return AllocSolution([FailMode.N1] * dropped + failures, len(candidates) - dropped, chosen)


def try_alloc(
    opts: AllocOptions,
    cluster: GCluster,
    inst: Instance,
    alloc_nodes,
    n1_check: Callable[[GCluster], bool] | None = None,
    scope: Sequence[int] | None = None,
    two_nodes: bool | None = None,
) -> AllocSolution:
    """Score every candidate; with ``n1_check`` keep the best that passes it.

    ``scope``: the nodes the score is computed over (default: all of the cluster's).
    """
    if two_nodes is None:
        two_nodes = bool(alloc_nodes) and isinstance(alloc_nodes[0], tuple)
    if not alloc_nodes:
        raise AllocError("Not enough online nodes" if two_nodes else "No online nodes")
    if not 0 <= inst.idx <= len(cluster.instances):
        # A new instance takes the next index (htools' extractNl fixes it the same way).
        inst = inst.copy()
        inst.idx = len(cluster.instances)
    universe = cluster.nodes if scope is None else [cluster.nodes[i] for i in scope]
    policy = _policy_check(cluster, inst)
    # The statistics are computed on first use: when every candidate fails (the common
    # case in hspace's shrink loops) they are not needed at all.
    computed: list[ClusterStats] = []
    value_rows: list[ValueRows] = []

    def stats() -> ClusterStats:
        if not computed:
            computed.append(rows().cluster_stats())  # `stats_of`, without a second look-up
        return computed[0]

    def rows() -> ValueRows:
        if not value_rows:
            value_rows.append(rows_of(universe))
        return value_rows[0]

    keep = (lambda c: n1_check(c.apply(cluster))) if n1_check is not None else None
    if not two_nodes:
        return _single_solution(opts, cluster, inst, alloc_nodes, scope, policy, stats, rows, keep)
    return _pair_solution(opts, cluster, inst, alloc_nodes, policy, stats, keep)


class _PairCandidate:
    """A node pair's score, its nodes built only if it is looked at (`candidate`): the
    values after the adds come from `fast_moves.node_values_after`, without copying the
    nodes, and the primary's add is done once for all its secondaries."""

    __slots__ = ("score", "s", "values_s", "primary", "built")

    def __init__(self, score: float, s: int, values_s: tuple, primary: list) -> None:
        self.score = score
        self.s = s
        self.values_s = values_s  # the secondary's `node_values` after the add
        self.primary = primary  # [cluster, inst, p, force, new primary node or None, its values]
        self.built = None

    def candidate(self) -> Candidate:
        if self.built is None:
            cluster, inst, p, force, new_p, values_p = self.primary
            if new_p is None:
                new_p = self.primary[4] = cluster.nodes[p].add_pri(inst, force=force)
                new_p.score_values = values_p  # `primary_outcome`'s are the new node's
            new_s = cluster.nodes[self.s].add_sec(inst, p)
            new_s.score_values = self.values_s
            placed = inst.copy()
            placed.pnode, placed.snode = p, self.s
            self.built = Candidate(((p, new_p), (self.s, new_s)), placed, self.score)
        return self.built

    def apply(self, cluster: GCluster) -> GCluster:
        return self.candidate().apply(cluster)


def _pair_solution(opts, cluster, inst, alloc_nodes, policy, stats, keep) -> AllocSolution:
    """`try_alloc` on node pairs: per primary, `allocate_on_pair` for each secondary (the
    same checks in the same order, the same score to the bit). Each node's outcome of
    the add is kept on the node (`fast_moves.primary_outcome`, `secondary_outcome`),
    and pairs whose nodes have the same values before and after share a score.

    htools sums the primaries' solutions (``sumAllocs``): folded here, without a solution
    per primary — each primary's failures go before the earlier ones' (it prepends), and
    the lowest score wins, ties to the later. Without an N+1 check only each primary's
    best pair is kept as a candidate; the others are scores."""
    nodes = cluster.nodes
    force = opts.ignore_soft_errors
    key = outcome_key(force, inst)
    parts: list[list[FailMode]] = []
    allocs = 0
    best: _PairCandidate | None = None
    templates: dict[int, tuple] = {}  # see `secondary_outcome`
    # Primaries with the same values before and after the add (interned: the same
    # objects) leave the same statistics, and their pairs with alike secondaries score
    # the same: (offline, values before, after) -> (statistics, pair scores).
    shared: dict[tuple, tuple[ClusterStats, dict[tuple, float]]] = {}
    for p, secondaries in alloc_nodes:
        tgt_p = nodes[p]
        fail = policy(tgt_p)
        if fail is None:
            memo = tgt_p.outcomes  # `primary_outcome`'s memo, looked at here: it mostly answers
            values_p = None if memo is None else memo.get(key)
            if values_p is None:
                values_p = primary_outcome(tgt_p, inst, force, key)
            if values_p.__class__ is not tuple:
                fail = values_p
        if fail is not None:  # every pair with this primary fails the same way
            parts.append([fail] * len(secondaries))
            continue
        old_p = node_values(tgt_p)
        found = shared.get((tgt_p.offline, id(old_p), id(values_p)))
        if found is None:
            base = stats().replace_values(tgt_p.offline, old_p, values_p)
            found = shared[tgt_p.offline, id(old_p), id(values_p)] = (base, {})
        base, scores = found
        failures: list[FailMode] = []
        pairs = []  # (score, secondary, its values after the add)
        for s in secondaries:
            tgt_s = nodes[s]
            values_s = secondary_outcome(tgt_s, inst, p, key, templates)
            if values_s.__class__ is not tuple:
                failures.append(values_s)
                continue
            old = node_values(tgt_s)
            pair = (tgt_s.offline, id(old), id(values_s))
            value = scores.get(pair)
            if value is None:
                value = scores[pair] = base.score_replaced_values(tgt_s.offline, old, values_s)
            pairs.append((value, s, values_s))
        failures.reverse()
        primary = [cluster, inst, p, force, None, values_p]
        if keep is None:
            chosen = None
            for item in pairs:  # the lowest, ties to the later
                if chosen is None or not (chosen[0] < item[0]):
                    chosen = item
            found = len(pairs)
            chosen = None if chosen is None else _PairCandidate(*chosen, primary)
        else:
            part = _collect([_PairCandidate(*item, primary) for item in pairs], failures, keep)
            failures, found, chosen = part.failures, part.allocs, part.solution
        parts.append(failures)
        allocs += found
        if chosen is not None and (best is None or not (best.score < chosen.score)):
            best = chosen
    parts.reverse()
    failed = [mode for part in parts for mode in part]
    return AllocSolution(failed, allocs, None if best is None else best.candidate())


def _single_solution(opts, cluster, inst, alloc_nodes, scope, policy, stats, rows, keep) -> AllocSolution:
    """`try_alloc` on single nodes (``stats``/``rows``: the lazily built score tables):
    `allocate_on_single` for each node, its checks in its order and its score to the bit,
    from the node's values after the add (no node is built unless it is looked at).

    Nodes whose values before and after the add are the same (`metrics.intern_values`
    makes them the same objects) form a class: one incremental score serves all of it,
    and the exact re-scoring of near ties runs per class (`ValueRows.score_class`)."""
    nodes = cluster.nodes
    outcomes = _outcomes(nodes, alloc_nodes, inst, opts.ignore_soft_errors, policy)
    failures: list[FailMode] = []
    feasible: list[tuple[int, _Class]] = []
    classes: dict[tuple, _Class] = {}
    for ndx, outcome in zip(alloc_nodes, outcomes, strict=True):
        if outcome.__class__ is not tuple:  # a FailMode
            failures.append(outcome)
            continue
        node = nodes[ndx]
        old = node_values(node)
        key = (node.offline, id(old), id(outcome))
        cls = classes.get(key)
        if cls is None:
            cls = classes[key] = _Class(node.offline, old, outcome)
        feasible.append((ndx, cls))
    failures.reverse()  # htools prepends each failure
    if classes:
        base = stats()
        for cls in classes.values():
            cls.score = base.score_replaced_values(cls.offline, cls.old, cls.new)
    # htools scores each single-node candidate with a full two-pass computation; the
    # incremental scores rank them the same except within near ties, which `exact`
    # settles (to the last bit, as ties break on it).
    exact = (lambda cands: _exact_scores(rows(), cands)) if opts.exact else None
    force = opts.ignore_soft_errors
    if keep is None:
        best = _best_single(feasible, exact)
        chosen = None if best is None else _SingleCandidate(best[1], best[0], cluster, inst, force, best[2])
        sol = AllocSolution(failures, len(feasible), chosen)
    else:
        candidates = [_SingleCandidate(cls, ndx, cluster, inst, force) for ndx, cls in feasible]
        sol = _collect(candidates, failures, keep, exact)
    if sol.solution is not None:
        sol.solution = sol.solution.candidate()
    return sol


def any_fit(
    opts: AllocOptions, cluster: GCluster, inst: Instance, alloc_nodes: list[int], n1_check, refute=None
) -> AllocSolution:
    """`try_alloc` on single nodes where only whether something fits, and the failure
    modes, are read (hspace's big-step search): the same answer to those, without a
    score. Some candidate passes ``n1_check`` (or there is no check) exactly when
    `try_alloc`'s best passing one exists, whichever is asked first; its `solution` is
    then that candidate, unscored (NaN). Without a fit, the failures are `try_alloc`'s
    (a FailN1 per feasible candidate, then the others'). ``refute(ndx, inst)``: true
    only where ``n1_check`` would fail on the candidate (`n_plus_one.Refuter`),
    answered without building it."""
    if not alloc_nodes:
        raise AllocError("No online nodes")
    nodes = cluster.nodes
    force = opts.ignore_soft_errors
    policy = _policy_check(cluster, inst)
    key = outcome_key(force, inst)
    failures: list[FailMode] = []
    feasible = 0
    for ndx in alloc_nodes:
        node = nodes[ndx]
        mode = _verdict(node, inst, force, key, policy)
        if mode is not None:
            failures.append(mode)
            continue
        feasible += 1
        if refute is not None and refute(ndx, inst):
            continue
        placed = inst.copy()
        placed.pnode, placed.snode = ndx, NO_NODE
        cand = Candidate(((ndx, node.add_pri(inst, force=force)),), placed, math.nan)
        if n1_check is None or n1_check(cand.apply(cluster)):
            return AllocSolution(failures, feasible, cand)
    failures.reverse()  # htools prepends each failure
    return AllocSolution([FailMode.N1] * feasible + failures, 0, None)


def refusals(opts: AllocOptions, cluster: GCluster, inst: Instance, alloc_nodes: list[int]) -> list[FailMode] | None:
    """`try_alloc`'s failures on single nodes when every candidate is refused, in its
    order; None when some node takes ``inst`` (or there is none: `try_alloc` says why).
    Asked without the values after the add (hspace's shrink chains try size after size
    that fits nowhere)."""
    if not alloc_nodes:
        return None
    nodes = cluster.nodes
    force = opts.ignore_soft_errors
    policy = _policy_check(cluster, inst)
    key = outcome_key(force, inst)
    failures = []
    for ndx in reversed(alloc_nodes):  # htools prepends each failure
        mode = _verdict(nodes[ndx], inst, force, key, policy)
        if mode is None:
            return None
        failures.append(mode)
    return failures


def _verdict(node: Node, inst: Instance, force: bool, key: int, policy) -> FailMode | None:
    """`allocate_on_single`'s verdict on ``node``: the policy's, then the add's (kept on the
    node by `_outcomes`, or its checks alone: the values after the add are not needed)."""
    mode = policy(node)
    if mode is not None:
        return mode
    memo = node.outcomes
    kept = None if memo is None else memo.get(key)
    if kept is not None:
        return None if kept.__class__ is tuple else kept
    try:
        pri_added(node, node, inst, force)
    except T.AllocFailure as failure:
        return failure.mode
    return None


class _Class:
    """Candidates with the same values before and after the add (and the same offline
    flag): the same incremental score."""

    __slots__ = ("offline", "old", "new", "score")

    def __init__(self, offline: bool, old: tuple, new: tuple) -> None:
        self.offline = offline
        self.old = old
        self.new = new
        self.score = 0.0


def _best_single(feasible: list[tuple[int, _Class]], exact) -> tuple[int, _Class, float] | None:
    """The lowest score of ``(node index, class)`` candidates, ties to the later (near
    ties re-scored exactly with ``exact``): ``(index, class, score)``."""
    if not feasible:
        return None
    if exact is not None:
        low = min([cls.score for _, cls in feasible])
        near = [item for item in feasible if item[1].score <= low + NEAR_TIE]
        # Alone, its exact score would change nothing (it keeps the estimate).
        values = exact(near) if len(near) > 1 else [near[0][1].score]
    else:
        near = feasible
        values = [cls.score for _, cls in feasible]
    best, best_value = None, 0.0
    for item, value in zip(near, values, strict=True):
        if best is None or not (best_value < value):
            best, best_value = item, value
    return best[0], best[1], best_value


def _exact_scores(rows: ValueRows, cands) -> list[float]:
    """The exact two-pass score of each candidate (``(node index, class)`` pairs or
    `_SingleCandidate`s), one `ValueRows.score_class` per class."""
    by_class: dict[int, tuple[_Class, list[int], list[int]]] = {}
    for i, cand in enumerate(cands):
        ndx, cls = (cand.ndx, cand.cls) if cand.__class__ is _SingleCandidate else cand
        found = by_class.get(id(cls))
        if found is None:
            found = by_class[id(cls)] = (cls, [], [])
        found[1].append(i)
        found[2].append(rows.position[ndx])
    out = [0.0] * len(cands)
    for cls, where, positions in by_class.values():
        for i, value in zip(where, rows.score_class(positions, cls.offline, cls.old, cls.new), strict=True):
            out[i] = value
    return out


class _SingleCandidate:
    """A single node's score; its node is built only if looked at (`candidate`)."""

    __slots__ = ("score", "cls", "ndx", "cluster", "inst", "force", "built")

    def __init__(self, cls: _Class, ndx: int, cluster, inst, force: bool, score: float | None = None) -> None:
        self.score = cls.score if score is None else score
        self.cls = cls
        self.ndx = ndx
        self.cluster = cluster
        self.inst = inst
        self.force = force
        self.built = None

    def candidate(self) -> Candidate:
        if self.built is None:
            ndx = self.ndx
            new = self.cluster.nodes[ndx].add_pri(self.inst, force=self.force)
            new.score_values = self.cls.new  # `primary_outcome`'s are the new node's, interned
            placed = self.inst.copy()
            placed.pnode, placed.snode = ndx, NO_NODE
            self.built = Candidate(((ndx, new),), placed, self.score)
        return self.built

    def apply(self, cluster: GCluster) -> GCluster:
        return self.candidate().apply(cluster)


def _outcomes(nodes, alloc_nodes, inst: Instance, force: bool, policy) -> list:
    """Per candidate node, what `allocate_on_single` meets: the `FailMode` it raises, or
    the node's `node_values` after the add (`fast_moves.primary_outcome`, kept on the
    node). The instance policy comes first."""
    key = outcome_key(force, inst)
    out: list = []
    missing: list[int] = []
    for ndx in alloc_nodes:
        node = nodes[ndx]
        mode = policy(node)
        if mode is None:
            memo = node.outcomes
            mode = None if memo is None else memo.get(key)
            if mode is None:
                missing.append(len(out))
        out.append(mode)
    if not missing:
        return out
    todo = [nodes[alloc_nodes[i]] for i in missing]
    # Many new ones (a new shape, as in hspace's shrink loops): the leading checks at once,
    # without an exception per failing node (`quick_checks`).
    quick = primary_failures(todo, inst, [None] * len(todo)) if len(todo) > 3 and not force else None
    for j, (i, node) in enumerate(zip(missing, todo, strict=True)):
        if quick is not None and quick[j] is not None:
            remember_outcome(node, key, quick[j])
            out[i] = quick[j]
        else:
            out[i] = primary_outcome(node, inst, force, key)
    return out


# ---------------------------------------------------------------------- groups


def split_cluster(cluster: GCluster) -> list[tuple[int, list[Node]]]:
    groups: dict[int, list[Node]] = {}
    for node in cluster.nodes:
        groups.setdefault(node.group, []).append(node)
    return sorted(groups.items())


def _n1_checker(opts: AllocOptions, scope: Sequence[int] | None = None):
    if not opts.capacity:
        return None
    return lambda cl: redundant(cl, scope, opts.accept_existing)


def _group_solution(opts, cluster, group_nodes, inst, count, scoped=False) -> AllocSolution:
    """One group's candidates; ``scoped``: score and check N+1 within the group only
    (htools' ``findAllocation``), else over the whole cluster (``findBestAllocGroup``)."""
    nodes = gen_alloc_nodes(opts, cluster, group_nodes, count, drop_unalloc=False)
    scope = [n.idx for n in group_nodes] if scoped else None
    return try_alloc(opts, cluster, inst, nodes, _n1_checker(opts, scope), scope, two_nodes=count == 2)


def _describe_group(group: T.Group, sol: AllocSolution | str) -> list[str]:
    if isinstance(sol, str):
        return [f"Group {group.name}: error {sol}"]
    return [f"Group {group.name} ({group.alloc_policy}): {line}" for line in sol.log]


def find_best_alloc_group(
    opts: AllocOptions,
    cluster: GCluster,
    inst: Instance,
    count: int,
    allowed_groups: Sequence[int] | None = None,
) -> tuple[T.Group, AllocSolution, list[str]]:
    groups = [(cluster.groups[g], nodes) for g, nodes in split_cluster(cluster)]
    if allowed_groups is not None:
        groups = [(g, nodes) for g, nodes in groups if g.idx in allowed_groups]
    messages: list[str] = []
    results: list[tuple[T.Group, AllocSolution]] = []
    for group, nodes in groups:
        try:
            sol = _group_solution(opts, cluster, nodes, inst, count)
        except AllocError as exc:
            messages += _describe_group(group, str(exc))
            continue
        sol.log.insert(0, sol.describe())
        messages += _describe_group(group, sol)
        if sol.solution is not None and group.allocable:
            results.append((group, sol))
    results.reverse()  # filterMGResults folds with a prepend
    order = {policy: i for i, policy in enumerate(T.ALLOC_POLICIES)}
    results.sort(key=lambda gs: (order[gs[0].alloc_policy], gs[1].solution.score))
    if not results:
        if not groups:
            raise AllocError(f"no groups for evacuation: allowed groups was {allowed_groups}")
        raise AllocError(", ".join(messages))
    group, sol = results[0]
    return group, sol, messages


def try_mg_alloc(opts: AllocOptions, cluster: GCluster, inst: Instance, count: int) -> AllocSolution:
    group, sol, messages = find_best_alloc_group(opts, cluster, inst, count)
    return replace(sol, log=[f"Selected group: {group.name}", *messages])


def try_group_alloc(
    opts: AllocOptions, cluster: GCluster, group_name: str, inst: Instance, count: int
) -> AllocSolution:
    gdx = cluster.group_index(group_name)
    group_nodes = [n for n in cluster.nodes if n.group == gdx]
    sol = _group_solution(opts, cluster, group_nodes, inst, count, scoped=True)
    sol.log.insert(0, sol.describe())
    return replace(sol, log=_describe_group(cluster.groups[gdx], sol))


def alloc_list(
    opts: AllocOptions,
    cluster: GCluster,
    requests: Sequence[tuple[Instance, int, str | None]],
) -> tuple[GCluster, list[tuple[Instance, AllocSolution]]]:
    """Multi-allocate: each instance placed on the cluster the previous ones left."""
    results = []
    for inst, count, group in requests:
        if group is None:
            sol = try_mg_alloc(opts, cluster, inst, count)
        else:
            sol = try_group_alloc(opts, cluster, group, inst, count)
        if sol.solution is not None:
            cluster = sol.solution.apply(cluster)
        results.append((inst, sol))
    return cluster, results
