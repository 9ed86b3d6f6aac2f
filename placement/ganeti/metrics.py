"""The htools cluster score, term for term as `hinfo` 3.0.2 prints it.

Contract: `node_values(node)` gives a node's contribution to each of the 20 components;
`ClusterStats` aggregates them (standard deviation over online nodes, or sums), can
replace one node's contribution by another's in O(components) (`replace`), and `score`
adds ``weight × value`` in Ganeti's order. `compute` does the full two-pass computation
exactly as Ganeti's ``calculate`` does, so scores agree to the last bit where htools uses
it; `replace` is Ganeti's own incremental update (used by hail for node pairs, and by
our hbal for every move).
"""

from __future__ import annotations

import math
import sys

# `operator` re-exports these from its C module after defining Python versions of all of
# them: importing the C module directly spares a tenth of a millisecond at every start.
from _operator import add, mul, ne, sub, truediv
from itertools import accumulate, compress, count, repeat
from math import sqrt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from .node import Node

STD, SUM = 0, 1

#: (name, weight, kind, online nodes?) in hinfo's order.
COMPONENTS: tuple[tuple[str, float, int, bool], ...] = (
    ("free_mem_cv", 0.5, STD, True),
    ("free_disk_cv", 0.5, STD, True),
    ("n1_cnt", 1.0, SUM, True),
    ("reserved_mem_cv", 1.0, STD, True),
    ("offline_all_cnt", 4.0, SUM, False),
    ("offline_pri_cnt", 16.0, SUM, False),
    ("vcpu_ratio_cv", 0.5, STD, True),
    ("cpu_load_cv", 1.0, STD, True),
    ("mem_load_cv", 1.0, STD, True),
    ("disk_load_cv", 1.0, STD, True),
    ("net_load_cv", 1.0, STD, True),
    ("pri_tags_score", 2.0, SUM, True),
    ("spindles_cv", 0.5, STD, True),
    ("free_mem_cv_forth", 0.5, STD, True),
    ("free_disk_cv_forth", 0.5, STD, True),
    ("vcpu_ratio_cv_forth", 0.5, STD, True),
    ("spindles_cv_forth", 0.5, STD, True),
    ("location_score", 1.0, SUM, True),
    ("location_exclusion_score", 1.0, SUM, True),
    ("reserved_mem_rtotal", 0.25, SUM, True),
)
NAMES = tuple(c[0] for c in COMPONENTS)
WEIGHTS = tuple(c[1] for c in COMPONENTS)
KINDS = tuple(c[2] for c in COMPONENTS)
ONLINE = tuple(c[3] for c in COMPONENTS)
NCOMP = len(COMPONENTS)
#: Per component, the earlier ones computed alike (kind, weight, nodes counted): with equal
#: columns, equal terms to the bit. By default the four load columns are the instance
#: counts, and without forthcoming instances each "_forth" column is its twin's.
TWINS = tuple(tuple(d for d in range(c) if COMPONENTS[d][1:] == COMPONENTS[c][1:]) for c in range(NCOMP))


def node_values(node: Node) -> tuple[float, ...]:
    """`compDetailedCVNode`: this node's value for every component (kept on the node:
    updates return new nodes, so a node's values never change once it is scored)."""
    values = node.score_values
    if values is None:
        values = node.score_values = intern_values(_node_values(node))
    return values


def intern_values(values: tuple[float, ...]) -> tuple[float, ...]:
    """One tuple object for equal values: nodes in the same state (a simulated cluster's,
    say) then share their values by identity, which allocation uses to score such nodes
    once (`allocation._single_solution`)."""
    found = _INTERNED.get(values)
    if found is None:
        if len(_INTERNED) >= 100_000:
            _INTERNED.clear()
        found = _INTERNED[values] = values
    return found


_INTERNED: dict[tuple[float, ...], tuple[float, ...]] = {}


def _node_values(node: Node) -> tuple[float, ...]:
    n_pri = len(node.plist)
    n_sec = len(node.slist)
    t_mem = node.t_mem
    p_rem = node.r_mem / t_mem
    speed = node.cpu_speed
    load = node.load
    hi_sp = node.hi_spindles
    return (
        node.unallocated_mem / t_mem,
        node.p_dsk,
        float(n_pri + n_sec) if node.fail_n1 else 0.0,
        p_rem,
        float(n_pri + n_sec),
        float(n_pri),
        node.u_cpu / node.t_cpu / speed,
        load[0],
        load[1],
        load[2],
        load[3],
        float(node.conflicting_primaries()),
        _ratio(node.inst_spindles, hi_sp),
        node.f_mem_forth / t_mem,
        node.p_dsk_forth,
        node.u_cpu_forth / node.t_cpu / speed,
        _ratio(node.inst_spindles_forth, hi_sp),
        0.0,  # location score: location tags are not modelled
        0.0,  # location exclusion score: idem
        p_rem,
    )


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return math.nan if a == 0 else math.copysign(math.inf, a)
    return a / b


class ClusterStats:
    """Per component: [count, sum, variance] (standard deviation) or [sum].

    ``twin``: per component, an earlier one whose statistics may be the same object
    (`ValueRows.twin`; `_SELF` when none is known). The same object means the same
    column, so a node replaced with the same values in both gives both the same result:
    computed once (see "Twin updates" below `_SELF`)."""

    __slots__ = ("stats", "terms", "twin")

    def __init__(self, stats: list[list[float]], twin: tuple[int, ...] | list[int] | None = None) -> None:
        self.stats = stats
        self.terms: list[float] | None = None  # each component's weighted term, on demand
        self.twin = _SELF if twin is None else twin

    @classmethod
    def compute(cls, nodes: Iterable[Node]) -> ClusterStats:
        nodes = list(nodes)
        return cls.from_rows([node_values(n) for n in nodes], [n.offline for n in nodes])

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[float]], offline: Sequence[bool]) -> ClusterStats:
        """`compute` from precomputed `node_values` rows (in node order)."""
        online_rows = [r for r, off in zip(rows, offline, strict=True) if not off]
        offline_rows = [r for r, off in zip(rows, offline, strict=True) if off]
        stats = []
        for c in range(NCOMP):
            values = [row[c] for row in (online_rows if ONLINE[c] else offline_rows)]
            stats.append(_std_stat(values) if KINDS[c] == STD else _sum_stat(values))
        return cls(stats)

    def copy(self) -> ClusterStats:
        return ClusterStats([list(s) for s in self.stats])

    def replace(self, old: Node, new: Node) -> ClusterStats:
        """`updateClusterStatistics`: ``old``'s contribution replaced by ``new``'s."""
        return self.replace_values(old.offline, node_values(old), node_values(new))

    def replace_values(self, offline: bool, old: Sequence[float], new: Sequence[float]) -> ClusterStats:
        """`replace` from the nodes' values. The new statistics keep this one's terms
        where a component is unchanged (when this one has them): a pair's scores are
        then computed from them without recomputing all twenty."""
        src = self.stats
        stats = list(src)
        terms = None if self.terms is None else list(self.terms)
        twin = self.twin
        for c, x, x2, ds, dss, dsds in value_changes(offline, old, new):
            t = twin[c]
            if t != c and src[t] is src[c] and old[t] == x and new[t] == x2:
                stats[c] = stats[t]  # see "Twin updates" below `_SELF`
                if terms is not None:
                    terms[c] = terms[t]
                continue
            stat = src[c]
            if ds is None:  # a sum
                value = stat[0] + x2 - x
                stats[c] = [value]
            else:
                n, s, var = stat
                dnnvar = (n * dss - 2 * s * ds) - dsds
                var += dnnvar / (n * n)
                var = var if var > 0.0 else 0.0  # max(0.0, var), NaN included, without a call
                stats[c] = [n, s + ds, var]
                value = sqrt(var)
            if terms is not None:
                terms[c] = WEIGHTS[c] * value  # `_term`
        out = ClusterStats(stats, twin)
        out.terms = terms
        return out

    def score_replaced(self, old: Node, new: Node) -> float:
        """``self.replace(old, new).score()``, bit for bit, faster."""
        terms = self.terms
        if terms is None:
            terms = self.terms = [_term(c, st) for c, st in enumerate(self.stats)]
        return _score_replacing(self.stats, terms, old.offline, node_values(old), node_values(new), self.twin)

    def score_replaced_values(self, offline: bool, old: Sequence[float], new: Sequence[float]) -> float:
        """`score_replaced` from the nodes' `node_values` (``offline``: the old node's)."""
        terms = self.terms
        if terms is None:
            terms = self.terms = [_term(c, st) for c, st in enumerate(self.stats)]
        return _score_replacing(self.stats, terms, offline, old, new, self.twin)

    def values(self) -> list[float]:
        return [math.sqrt(st[2]) if KINDS[c] == STD else st[0] for c, st in enumerate(self.stats)]

    def score(self) -> float:
        total = 0.0
        for c, st in enumerate(self.stats):
            total += WEIGHTS[c] * (math.sqrt(st[2]) if KINDS[c] == STD else st[0])
        return total


class ColumnStats:
    """`ClusterStats.compute(nodes)`, bit for bit, kept up to date while nodes are replaced
    one at a time (the global N+1 check re-creates instances one by one and scores every
    target each time): a replacement recomputes, from the whole column as `compute` does,
    only the components whose value changed on that node.

    `score_replacing(pos, values)` is ``stats.replace(old, new).score()`` (``values``:
    the new node's `node_values`) with the same float operations, reusing the unchanged
    components' terms."""

    __slots__ = ("columns", "offline", "rows", "slot", "stats", "terms")

    def __init__(self, nodes: Sequence[Node] | None) -> None:
        if nodes is None:
            return
        self.rows = [node_values(n) for n in nodes]
        self.offline = [n.offline for n in nodes]
        online = [i for i, off in enumerate(self.offline) if not off]
        offline = [i for i, off in enumerate(self.offline) if off]
        self.columns = [[self.rows[i][c] for i in (online if ONLINE[c] else offline)] for c in range(NCOMP)]
        self.slot = {i: k for group in (online, offline) for k, i in enumerate(group)}
        self.stats = [
            _std_stat(self.columns[c]) if KINDS[c] == STD else _sum_stat(self.columns[c]) for c in range(NCOMP)
        ]
        self.terms = [_term(c, st) for c, st in enumerate(self.stats)]

    def copy(self) -> ColumnStats:
        new = ColumnStats(None)
        new.rows = list(self.rows)
        new.offline = self.offline
        new.columns = [list(col) for col in self.columns]
        new.slot = self.slot
        new.stats = list(self.stats)
        new.terms = list(self.terms)
        return new

    def set(self, pos: int, node: Node) -> None:
        old, new = self.rows[pos], node_values(node)
        off = self.offline[pos]
        self.rows[pos] = new
        k = self.slot[pos]
        columns, stats, terms = self.columns, self.stats, self.terms
        for c in compress(_COMPONENTS, map(ne, new, old)):
            if ONLINE[c] != off:
                column = columns[c]
                column[k] = new[c]
                for d in TWINS[c]:  # an equal twin column (up to date: d < c) has the statistics
                    if columns[d] == column:
                        stats[c], terms[c] = stats[d], terms[d]
                        break
                else:
                    st = stats[c] = _std_stat(column) if KINDS[c] == STD else _sum_stat(column)
                    terms[c] = _term(c, st)

    def score_replacing(self, pos: int, new: Sequence[float]) -> float:
        return _score_replacing(self.stats, self.terms, self.offline[pos], self.rows[pos], new)


def _term(c: int, st: list[float]) -> float:
    return WEIGHTS[c] * (math.sqrt(st[2]) if KINDS[c] == STD else st[0])


def _score_replacing(
    stats, terms, off: bool, old: Sequence[float], new: Sequence[float], twin: Sequence[int] | None = None
) -> float:
    """``ClusterStats(stats).replace_values(off, old, new).score()``, bit for bit, with
    the unchanged components' ``terms`` reused: the changed components come from
    `value_changes`, and the terms are added in order as the score adds them (`_fold`).
    ``twin``: as `ClusterStats.twin` (a twin's term is reused: "Twin updates" below `_SELF`)."""
    changes = value_changes(off, old, new)
    if not changes:
        return _fold(terms, 0.0)
    if twin is None:
        twin = _SELF
    out = list(terms)
    for c, x, x2, ds, dss, dsds in changes:
        t = twin[c]
        if t != c and stats[t] is stats[c] and old[t] == x and new[t] == x2:
            out[c] = out[t]  # see "Twin updates" below `_SELF`
            continue
        stat = stats[c]
        if ds is None:  # a sum
            out[c] = WEIGHTS[c] * (stat[0] + x2 - x)
        else:  # `ClusterStats.replace_values`' update, then `score`'s term
            n, s, var = stat
            var += ((n * dss - 2 * s * ds) - dsds) / (n * n)
            out[c] = WEIGHTS[c] * sqrt(var if var > 0.0 else 0.0)
    return _fold(out, 0.0)


def value_changes(off: bool, old: Sequence[float], new: Sequence[float]) -> tuple:
    """What replacing a node's values ``old`` by ``new`` (the node offline: ``off``) changes
    in the statistics: per component it counts in whose value changed, ``(c, x, x2, ds,
    dss, dsds)`` — old and new value, and for a standard deviation the parts of Ganeti's
    update that do not read the statistics (``x2 − x``, ``x2² − x²``, ``ds²``; None for a
    sum), computed as the update computes them, so the same bits.

    Kept per pair of interned value tuples (`intern_values`): in a node-pair search every
    primary's statistics take each secondary's change, and a node that did not change keeps
    its outcomes, and so its changes, from one placement to the next."""
    key = (off, id(old), id(new))
    found = _CHANGES.get(key)
    if found is not None:
        return found[2]
    out = []
    for c in compress(_COMPONENTS, map(ne, old, new)):
        if ONLINE[c] == off:
            continue
        x, x2 = old[c], new[c]
        if KINDS[c] == SUM:
            out.append((c, x, x2, None, None, None))
        else:
            ds = x2 - x
            out.append((c, x, x2, ds, x2 * x2 - x * x, ds * ds))
    changes = tuple(out)
    if len(_CHANGES) >= 4096:
        _CHANGES.clear()
    _CHANGES[key] = (old, new, changes)  # both held, so the ids keying it stay theirs
    return changes


_CHANGES: dict[tuple, tuple] = {}


_COMPONENTS = range(NCOMP)
#: No component known to share its statistics with another (`ClusterStats.twin`).
_SELF = tuple(_COMPONENTS)

# Twin updates: why a twin's updated statistics (and term) can be reused. Twins (`TWINS`)
# are computed alike (kind, weight, nodes counted); statistics that are one object
# describe equal columns (`ValueRows` shares them only then, and `replace_values` only
# when both moved alike), and a replaced node moving both by the same values
# (``old[t] == old[c]``, ``new[t] == new[c]``, both changed) gives both the same float
# operations on the same inputs — a zero's sign, the one difference ``==`` ignores,
# changes neither a difference with a non-zero value nor a square. By default the four
# load columns are the instance counts, and a primary add moves them alike.


if sys.version_info < (3, 12):
    # Up to 3.11, sum() adds floats left to right in a C double: reduce(add, ..., start)'s
    # exact arithmetic, three times faster. From 3.12 on it compensates (other bits).
    #: ``_fold(values, start)``: ``start`` plus each value, left to right (the hot loops
    #: call it directly, with ``start=0.0`` for a plain sum: no Python-level call).
    _fold = sum

else:  # pragma: no cover - the project runs 3.11
    from functools import reduce

    def _fold(values, start: float) -> float:
        return reduce(add, values, start)


def _std_stat(values: list[float]) -> list[float]:
    # Ganeti's `calculate`: count and sum in one pass, then the centred sum of squares,
    # each added left to right (`_fold`).
    n = float(len(values))
    if not n:
        return [0.0, 0.0, math.nan]
    s = _fold(values, 0.0)
    mean = s / n
    return [n, s, _deviations(values, mean) / n]


def _deviations(values: Sequence[float], mean: float) -> float:
    """Σ (x − mean)², each deviation squared as (x − mean) * (x − mean), added left to
    right from 0.0 (`_fold`'s order). A plain loop: on 3.11 it takes two thirds of the
    time of the same sum over chained maps (measured from 3 to 10,000 values)."""
    nvar = 0.0
    for x in values:
        d = x - mean
        nvar += d * d
    return nvar


def _sum_stat(values: list[float]) -> list[float]:
    return [_fold(values, 0.0)]


def _share_twins(columns: list[list[float]]) -> list[int]:
    """Per component, the first of its `TWINS` with an equal column (else itself); equal
    columns become one list (compared by identity next time). Equal lists hold equal
    floats, and the one difference ``==`` ignores, the sign of a zero, changes no sum
    that starts at +0.0 and no square."""
    return _reshare_twins(columns, list(range(NCOMP)), _ALL_COMPONENTS)


_ALL_COMPONENTS = frozenset(range(NCOMP))
#: (c, its `TWINS`, c and its `TWINS`) for the components that have twins: one without
#: any is always its own (`_reshare_twins` leaves it as it was: itself).
_TWIN_SCOPES = tuple((c, TWINS[c], frozenset((c, *TWINS[c]))) for c in range(NCOMP) if TWINS[c])


def _reshare_twins(columns: list[list[float]], twin: list[int], fresh: set[int]) -> list[int]:
    """`_share_twins` after the ``fresh`` columns changed, the others as they were under
    ``twin`` (`_share_twins`' answer before): only components with a changed column among
    themselves and their `TWINS` are matched again — the same answer, since the others
    compare the same unchanged columns, whose own twins (among their `TWINS`, a subset of
    theirs) are unchanged too."""
    twin = list(twin)
    for c, twins, scope in _TWIN_SCOPES:
        if fresh.isdisjoint(scope):
            continue
        twin[c] = c
        col = columns[c]
        for d in twins:
            if twin[d] == d and (columns[d] is col or columns[d] == col):
                twin[c] = d
                columns[c] = columns[d]
                break
    return twin


#: Classes of fewer candidates than this are scored one column at a time (`score_class`).
SMALL_CLASS = 8


class ValueRows:
    """The `node_values` of a node list, computed once, scored with some nodes replaced —
    the exact two-pass score of many candidates that each change one or two nodes.

    Components a replacement leaves unchanged keep the base statistics (bit-identical by
    construction); only the changed columns are recomputed, in node order. A state one or
    two nodes away from a known one is `derive`d from it (its unchanged columns shared),
    as hspace's consecutive placements each change one node."""

    __slots__ = (
        "nodes",
        "base",
        "columns",
        "offline",
        "position",
        "rows",
        "slot",
        "terms",
        "prefixes",
        "deviations",
        "stats",
        "twin",
    )

    def __init__(self, nodes: Sequence[Node] | None) -> None:
        if nodes is None:  # filled in by `derive`
            return
        self.nodes = tuple(nodes)
        self.rows = [node_values(n) for n in nodes]
        self.offline = [n.offline for n in nodes]
        self.position = {n.idx: i for i, n in enumerate(nodes)}
        online = [i for i, off in enumerate(self.offline) if not off]
        offline = [i for i, off in enumerate(self.offline) if off]
        self.columns = [[self.rows[i][c] for i in (online if ONLINE[c] else offline)] for c in range(NCOMP)]
        # A node's index within the online (or offline) columns.
        self.slot = {i: k for group in (online, offline) for k, i in enumerate(group)}
        self.twin = _share_twins(self.columns)
        # `ClusterStats.from_rows`' statistics: the same columns, in the same order.
        self.base = base = []
        for c, col in enumerate(self.columns):
            t = self.twin[c]
            base.append(base[t] if t != c else _std_stat(col) if KINDS[c] == STD else _sum_stat(col))
        self.terms = [_term(c, st) for c, st in enumerate(self.base)]  # each component's weighted term
        self.prefixes: list = [None] * NCOMP  # running sums of the columns, on demand
        self.deviations: list = [None] * NCOMP  # per column, mean -> squared deviations, their running sums
        self.stats: ClusterStats | None = None

    def derive(self, nodes: Sequence[Node], changed: Sequence[int]) -> ValueRows | None:
        """`ValueRows(nodes)`, bit for bit, where ``nodes`` differ from this one's at the
        positions ``changed`` only (None when a node there is another one, or went offline):
        the changed columns are recomputed whole, as a fresh build does."""
        rows = list(self.rows)
        columns = list(self.columns)
        fresh: set[int] = set()
        for p in changed:
            node, was = nodes[p], self.nodes[p]
            if node.idx != was.idx or node.offline != was.offline:
                return None
            old, values = rows[p], node_values(node)
            rows[p] = values
            k = self.slot[p]
            # The changes were usually found already: the allocation scored this very node.
            for c, _, x2, _, _, _ in value_changes(was.offline, old, values):
                if c not in fresh:
                    columns[c] = list(columns[c])
                    fresh.add(c)
                columns[c][k] = x2
        new = ValueRows(None)
        new.nodes = tuple(nodes)
        new.rows = rows
        new.offline = self.offline
        new.position = self.position
        new.columns = columns
        new.slot = self.slot
        new.base, new.terms = list(self.base), list(self.terms)
        new.prefixes, new.deviations = list(self.prefixes), list(self.deviations)
        new.twin = twin = _reshare_twins(columns, self.twin, fresh)
        for c in sorted(fresh):
            t = twin[c]
            if t != c:  # an equal column's statistics (its own are up to date: t < c)
                new.base[c], new.terms[c] = new.base[t], new.terms[t]
            elif KINDS[c] == STD:  # `_std_stat` and `_term`, without the calls (hot)
                st = new.base[c] = _std_stat(columns[c])
                new.terms[c] = WEIGHTS[c] * sqrt(st[2])
            else:
                value = _fold(columns[c], 0.0)
                new.base[c] = [value]
                new.terms[c] = WEIGHTS[c] * value
            new.prefixes[c] = new.deviations[c] = None
        new.stats = None
        return new

    def cluster_stats(self) -> ClusterStats:
        """`ClusterStats.compute` of these nodes (the same statistics)."""
        if self.stats is None:
            self.stats = ClusterStats(self.base, self.twin)
            self.stats.terms = self.terms
        return self.stats

    def score_class(
        self, positions: Sequence[int], off: bool, old: Sequence[float], new: Sequence[float]
    ) -> list[float]:
        """``[score_with(n) for n in replacements]`` where each replacement takes the place
        of the node at one of ``positions``, all of which hold the values ``old`` (offline:
        ``off``) and become ``new`` — a class of identical candidates, as the nodes of a
        simulated cluster are. Bit for bit `_score_with_one`'s arithmetic, with the loops
        over candidates in C (`column_terms`), and twin columns computed once."""
        ks = [self.slot[p] for p in positions]
        count = len(ks)
        if count == 1:
            return [self._score_at(ks[0], off, old, new)]
        # A few candidates: each one's column rebuilt (`_rebuilt_terms`) costs less than
        # the running sums' set-up (measured: up to some 8 candidates, on 5 to 300 nodes).
        terms_of = self._rebuilt_terms if count < SMALL_CLASS else self.column_terms
        totals = [0.0] * count
        done: dict[int, list[float]] = {}  # per component computed, its terms
        for c in range(NCOMP):
            x = new[c]
            if ONLINE[c] == off or x == old[c]:
                totals = list(map(add, totals, repeat(self.terms[c], count)))
                continue
            t = self.twin[c]
            if t in done and new[t] == x:  # an equal column, the same new value: the same terms
                totals = list(map(add, totals, done[t]))
                continue
            terms = done[c] = terms_of(c, ks, x)
            totals = list(map(add, totals, terms))
        return totals

    def _rebuilt_terms(self, c: int, ks: Sequence[int], x: float) -> list[float]:
        """`column_terms`, each candidate's column rebuilt with ``x`` at its slot and
        scored as `_score_at` scores it (the same float operations)."""
        column = self.columns[c]
        w = WEIGHTS[c]
        out = []
        if KINDS[c] != STD:
            for k in ks:
                col = column.copy()
                col[k] = x
                out.append(w * _fold(col, 0.0))
            return out
        n = float(len(column))
        sqrt = math.sqrt
        for k in ks:
            col = column.copy()
            col[k] = x
            mean = _fold(col, 0.0) / n
            out.append(w * sqrt(_deviations(col, mean) / n))
        return out

    def column_terms(self, c: int, ks: Sequence[int], x: float) -> list[float]:
        """Component ``c``'s weighted term with ``x`` in place of the value at each of the
        slots ``ks`` — `_score_with_one`'s term, bit for bit: the sum is the running sum up
        to the slot, plus ``x``, plus the rest of the column; the squared deviations
        likewise, once per mean (the sums, and so the means, may differ in their last bits
        with the slot)."""
        column = self.columns[c]
        prefix = self.prefixes[c]
        if prefix is None:
            prefix = self.prefixes[c] = list(accumulate(column, initial=0.0))
        tails = [slice(k + 1, None) for k in ks]
        sums = list(map(_fold, map(column.__getitem__, tails), map(add, map(prefix.__getitem__, ks), repeat(x))))
        w = WEIGHTS[c]
        if KINDS[c] != STD:
            return list(map(mul, repeat(w), sums))
        n = float(len(column))
        if sums.count(sums[0]) == len(sums):
            return self._std_terms(c, sums[0] / n, x, ks, tails, w)
        terms = [0.0] * len(sums)
        by_sum: dict[float, list[int]] = {}
        for i, value in enumerate(sums):
            by_sum.setdefault(value, []).append(i)
        for value, where in by_sum.items():
            part = self._std_terms(c, value / n, x, [ks[i] for i in where], [tails[i] for i in where], w)
            for i, term in zip(where, part, strict=True):
                terms[i] = term
        return terms

    def _std_terms(self, c: int, mean: float, x: float, ks: Sequence[int], tails: list[slice], w: float) -> list[float]:
        """Component ``c``'s weighted standard deviation with ``x`` at each of the slots
        ``ks`` (``tails``: the slices after them), all with this ``mean``."""
        by_mean = self.deviations[c]
        if by_mean is None:
            by_mean = self.deviations[c] = {}
        found = by_mean.get(mean)
        if found is None:
            column = self.columns[c]
            squares = list(map(mul, map(sub, column, repeat(mean)), map(sub, column, repeat(mean))))
            found = by_mean[mean] = (squares, list(accumulate(squares, initial=0.0)))
        squares, prefix = found
        d = x - mean
        nvars = map(_fold, map(squares.__getitem__, tails), map(add, map(prefix.__getitem__, ks), repeat(d * d)))
        n = float(len(squares))
        return list(map(mul, repeat(w), map(math.sqrt, map(truediv, nvars, repeat(n)))))

    def score_with(self, *replacements: Node) -> float:
        if len(replacements) == 1:
            return self._score_with_one(replacements[0])
        changed: dict[int, dict[int, float]] = {}
        for node in replacements:
            pos = self.position[node.idx]
            old, new, off = self.rows[pos], node_values(node), self.offline[pos]
            for c in range(NCOMP):
                if ONLINE[c] != off and new[c] != old[c]:
                    changed.setdefault(c, {})[self.slot[pos]] = new[c]
        total = 0.0
        for c in range(NCOMP):
            if c in changed:
                column = self.columns[c].copy()
                for k, value in changed[c].items():
                    column[k] = value
                st = _std_stat(column) if KINDS[c] == STD else _sum_stat(column)
            else:
                st = self.base[c]
            total += WEIGHTS[c] * (math.sqrt(st[2]) if KINDS[c] == STD else st[0])
        return total

    def _score_with_one(self, node: Node) -> float:
        """`score_with` of one node (hspace's single-node candidates): the same float
        operations, without its bookkeeping."""
        pos = self.position[node.idx]
        return self._score_at(self.slot[pos], self.offline[pos], self.rows[pos], node_values(node))

    def _score_at(self, k: int, off: bool, old: Sequence[float], new: Sequence[float]) -> float:
        """`_score_with_one` of the node in slot ``k`` (values ``old``) replaced by one
        with the values ``new``."""
        terms = self.terms
        twin = self.twin
        done: dict[int, float] = {}  # per component computed, its term
        total = 0.0
        for c in range(NCOMP):
            x = new[c]
            if ONLINE[c] == off or x == old[c]:
                total += terms[c]
                continue
            t = twin[c]
            if t in done and new[t] == x:  # an equal column, the same new value
                total += done[t]
                continue
            column = self.columns[c].copy()
            column[k] = x
            if KINDS[c] != STD:
                term = done[c] = WEIGHTS[c] * _fold(column, 0.0)
                total += term
                continue
            # `_std_stat` inline (never empty: this node is in the column).
            n = float(len(column))
            mean = _fold(column, 0.0) / n
            nvar = _deviations(column, mean)
            term = done[c] = WEIGHTS[c] * math.sqrt(nvar / n)
            total += term
        return total


def stats_of(nodes: Sequence[Node]) -> ClusterStats:
    """`ClusterStats.compute(nodes)`, remembered for these node objects: hspace scores the
    same cluster state again for every spec it tries (statistics are never changed in
    place, and neither are nodes once scored)."""
    return rows_of(nodes).cluster_stats()


def rows_of(nodes: Sequence[Node]) -> ValueRows:
    """`ValueRows(nodes)`, remembered for these node objects, and derived from the last
    one built when only a few nodes differ (hspace places one instance after another)."""
    key = tuple(map(id, nodes))
    found = _ROWS.get(key)
    if found is not None:
        return found
    last = _LAST_ROWS[0]
    rows = None
    if last is not None and len(last.nodes) == len(nodes):
        changed = [i for i, a, b in zip(count(), nodes, last.nodes) if a is not b]
        if len(changed) <= 2:
            rows = last.derive(nodes, changed)
    if rows is None:
        rows = ValueRows(nodes)
    if len(_ROWS) >= 16:
        _ROWS.pop(next(iter(_ROWS)))
    _ROWS[key] = rows  # it holds the nodes, so the ids keying the cache stay theirs
    _LAST_ROWS[0] = rows
    return rows


_ROWS: dict[tuple[int, ...], ValueRows] = {}
_LAST_ROWS: list[ValueRows | None] = [None]


def score(nodes: Iterable[Node]) -> float:
    """`compCV`: the cluster score of these nodes."""
    return ClusterStats.compute(nodes).score()


def detailed(nodes: Iterable[Node]) -> list[tuple[str, float, float]]:
    """(name, value, weight) per component — hinfo's "Cluster coefficients" table."""
    values = ClusterStats.compute(nodes).values()
    return [(NAMES[c], values[c], WEIGHTS[c]) for c in range(NCOMP)]
