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
from itertools import repeat
from operator import mul, sub

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


def node_values(node: Node) -> tuple[float, ...]:
    """`compDetailedCVNode`: this node's value for every component (kept on the node:
    updates return new nodes, so a node's values never change once it is scored)."""
    values = node.score_values
    if values is None:
        values = node.score_values = _node_values(node)
    return values


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
    """Per component: [count, sum, variance] (standard deviation) or [sum]."""

    __slots__ = ("stats", "terms")

    def __init__(self, stats: list[list[float]]) -> None:
        self.stats = stats
        self.terms: list[float] | None = None  # each component's weighted term, on demand

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

    def replace_values(
        self, offline: bool, old: Sequence[float], new: Sequence[float]
    ) -> ClusterStats:
        stats = list(self.stats)
        for c in range(NCOMP):
            if ONLINE[c] == offline:
                continue
            x, x2 = old[c], new[c]
            if x == x2:
                continue
            stat = stats[c]
            if KINDS[c] == SUM:
                stats[c] = [stat[0] + x2 - x]
            else:
                n, s, var = stat
                ds = x2 - x
                dss = x2 * x2 - x * x
                dnnvar = (n * dss - 2 * s * ds) - ds * ds
                stats[c] = [n, s + ds, max(0.0, var + dnnvar / (n * n))]
        return ClusterStats(stats)

    def score_replaced(self, old: Node, new: Node) -> float:
        """``self.replace(old, new).score()``, bit for bit, faster."""
        terms = self.terms
        if terms is None:
            terms = self.terms = [_term(c, st) for c, st in enumerate(self.stats)]
        return _score_replacing(self.stats, terms, old.offline, node_values(old), node_values(new))

    def score_replaced_values(self, offline: bool, old: Sequence[float], new: Sequence[float]) -> float:
        """`score_replaced` from the nodes' `node_values` (``offline``: the old node's)."""
        terms = self.terms
        if terms is None:
            terms = self.terms = [_term(c, st) for c, st in enumerate(self.stats)]
        return _score_replacing(self.stats, terms, offline, old, new)

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
        for c in range(NCOMP):
            if ONLINE[c] != off and new[c] != old[c]:
                column = self.columns[c]
                column[k] = new[c]
                st = self.stats[c] = _std_stat(column) if KINDS[c] == STD else _sum_stat(column)
                self.terms[c] = _term(c, st)

    def score_replacing(self, pos: int, new: Sequence[float]) -> float:
        return _score_replacing(self.stats, self.terms, self.offline[pos], self.rows[pos], new)


def _term(c: int, st: list[float]) -> float:
    return WEIGHTS[c] * (math.sqrt(st[2]) if KINDS[c] == STD else st[0])


def _score_replacing(stats, terms, off: bool, old: Sequence[float], new: Sequence[float]) -> float:
    """``ClusterStats(stats).replace_values(off, old, new).score()``, bit for bit, with
    the unchanged components' ``terms`` reused."""
    total = 0.0
    for c in range(NCOMP):
        x, x2 = old[c], new[c]
        if ONLINE[c] == off or x == x2:
            total += terms[c]
            continue
        stat = stats[c]
        if KINDS[c] == SUM:
            total += WEIGHTS[c] * (stat[0] + x2 - x)
        else:  # `ClusterStats.replace_values`' update, then `score`'s term
            n, s, var = stat
            ds = x2 - x
            dss = x2 * x2 - x * x
            dnnvar = (n * dss - 2 * s * ds) - ds * ds
            total += WEIGHTS[c] * math.sqrt(max(0.0, var + dnnvar / (n * n)))
    return total


if sys.version_info < (3, 12):
    # Up to 3.11, sum() adds floats left to right in a C double: reduce(add, ..., 0.0)'s
    # exact arithmetic, three times faster. From 3.12 on it compensates (other bits).
    def _plain_sum(values) -> float:
        return sum(values, 0.0)

else:  # pragma: no cover - the project runs 3.11
    from functools import reduce
    from operator import add

    def _plain_sum(values) -> float:
        return reduce(add, values, 0.0)


def _std_stat(values: list[float]) -> list[float]:
    # Ganeti's `calculate`: count and sum in one pass, then the centred sum of squares,
    # each added left to right (`_plain_sum`).
    n = float(len(values))
    if not n:
        return [0.0, 0.0, math.nan]
    s = _plain_sum(values)
    mean = s / n
    # Σ (x − mean)², each deviation squared as (x − mean) * (x − mean), all in C (no
    # Python-level loop: this runs for every exactly scored candidate).
    nvar = _plain_sum(map(mul, map(sub, values, repeat(mean)), map(sub, values, repeat(mean))))
    return [n, s, nvar / n]


def _sum_stat(values: list[float]) -> list[float]:
    return [_plain_sum(values)]


#: Candidates from which the bulk re-scoring pays even for numpy's import (about 0.1 s, as
#: much as Ganeti's whole hspace run on ten nodes); once imported, 8 suffice.
NUMPY_IMPORT_PAYS = 64


class ValueRows:
    """The `node_values` of a node list, computed once, scored with some nodes replaced —
    the exact two-pass score of many candidates that each change one or two nodes.

    Components a replacement leaves unchanged keep the base statistics (bit-identical by
    construction); only the changed columns are recomputed, in node order."""

    __slots__ = ("base", "columns", "arrays", "offline", "position", "rows", "slot", "terms")

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.rows = [node_values(n) for n in nodes]
        self.offline = [n.offline for n in nodes]
        self.position = {n.idx: i for i, n in enumerate(nodes)}
        self.base = ClusterStats.from_rows(self.rows, self.offline).stats
        online = [i for i, off in enumerate(self.offline) if not off]
        offline = [i for i, off in enumerate(self.offline) if off]
        self.columns = [
            [self.rows[i][c] for i in (online if ONLINE[c] else offline)] for c in range(NCOMP)
        ]
        # A node's index within the online (or offline) columns.
        self.slot = {i: k for group in (online, offline) for k, i in enumerate(group)}
        self.arrays: list = [None] * NCOMP  # columns as numpy arrays, on demand
        self.terms: list[float] | None = None  # each base component's weighted term, on demand

    def score_many(self, replacements: Sequence[Node]) -> list[float]:
        """``[score_with(node) for node in replacements]``, bit for bit, in bulk: each
        changed column is rebuilt once per candidate as a row of a matrix, and the sums
        are running sums along the rows (``cumsum`` adds left to right, as `_std_stat`'s
        ``reduce``; numpy's ``sum`` would add pairwise and round differently). hspace
        re-scores every near-tied candidate exactly, and on identical nodes that is
        all of them: O(nodes²) per placement, which this keeps out of Python."""
        count = len(replacements)
        if count < 8 or (count < NUMPY_IMPORT_PAYS and "numpy" not in sys.modules):
            return [self.score_with(node) for node in replacements]
        import numpy as np  # only here: a small run is done before numpy would be imported

        slots, news = [], []
        for node in replacements:
            pos = self.position[node.idx]
            slots.append((self.slot[pos], self.offline[pos], self.rows[pos]))
            news.append(node_values(node))
        total = np.zeros(count)
        for c in range(NCOMP):
            base = self.base[c]
            term = WEIGHTS[c] * (math.sqrt(base[2]) if KINDS[c] == STD else base[0])
            which = [
                k for k, (_, off, old) in enumerate(slots) if ONLINE[c] != off and news[k][c] != old[c]
            ]
            if not which:
                total += term
                continue
            column = self.arrays[c]
            if column is None:
                column = self.arrays[c] = np.array(self.columns[c], dtype=float)
            n = float(len(column))
            matrix = np.tile(column, (len(which), 1))
            matrix[np.arange(len(which)), [slots[k][0] for k in which]] = [news[k][c] for k in which]
            sums = np.cumsum(matrix, axis=1)[:, -1]
            if KINDS[c] == STD:
                deviations = matrix - (sums / n)[:, None]
                values = WEIGHTS[c] * np.sqrt(np.cumsum(deviations * deviations, axis=1)[:, -1] / n)
            else:
                values = WEIGHTS[c] * sums
            terms = np.full(count, term)
            terms[which] = values
            total += terms
        return total.tolist()

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
        old, new, off = self.rows[pos], node_values(node), self.offline[pos]
        k = self.slot[pos]
        terms = self.terms
        if terms is None:
            terms = self.terms = [_term(c, st) for c, st in enumerate(self.base)]
        total = 0.0
        for c in range(NCOMP):
            x = new[c]
            if ONLINE[c] == off or x == old[c]:
                total += terms[c]
                continue
            column = self.columns[c].copy()
            column[k] = x
            if KINDS[c] != STD:
                total += WEIGHTS[c] * _plain_sum(column)
                continue
            # `_std_stat` inline (never empty: this node is in the column).
            n = float(len(column))
            mean = _plain_sum(column) / n
            nvar = _plain_sum(map(mul, map(sub, column, repeat(mean)), map(sub, column, repeat(mean))))
            total += WEIGHTS[c] * math.sqrt(nvar / n)
        return total


def stats_of(nodes: Sequence[Node]) -> ClusterStats:
    """`ClusterStats.compute(nodes)`, remembered for these node objects: hspace scores the
    same cluster state again for every spec it tries (statistics are never changed in
    place, and neither are nodes once scored)."""
    return _remembered(_STATS, nodes, ClusterStats.compute)


def rows_of(nodes: Sequence[Node]) -> ValueRows:
    """`ValueRows(nodes)`, remembered like `stats_of`."""
    return _remembered(_ROWS, nodes, ValueRows)


_STATS: dict[tuple[int, ...], tuple] = {}
_ROWS: dict[tuple[int, ...], tuple] = {}


def _remembered(cache: dict, nodes: Sequence[Node], build):
    key = tuple(map(id, nodes))
    found = cache.get(key)
    if found is None:
        if len(cache) >= 16:
            cache.pop(next(iter(cache)))
        nodes = tuple(nodes)  # held, so the ids keying the cache stay theirs
        found = cache[key] = (nodes, build(nodes))
    return found[1]


def score(nodes: Iterable[Node]) -> float:
    """`compCV`: the cluster score of these nodes."""
    return ClusterStats.compute(nodes).score()


def detailed(nodes: Iterable[Node]) -> list[tuple[str, float, float]]:
    """(name, value, weight) per component — hinfo's "Cluster coefficients" table."""
    values = ClusterStats.compute(nodes).values()
    return [(NAMES[c], values[c], WEIGHTS[c]) for c in range(NCOMP)]
