"""hbal's steepest descent, exact, with the move neighbourhood held in numpy arrays.

Contract: `steepest_descent(problem, board, rule, on_step)` takes the moves a plain
steepest descent (`tests/.../reference_balance.py`) takes on an hbal problem — every round
the best move of the whole neighbourhood, ties to the earliest instance and then the
earliest of its moves, in hbal's order — with bit-identical scores, and stops under the
same `GainRule`. Infeasible moves are skipped until a node they involve changes.

Why it is fast: a move changes two or three nodes, so after it

- only the *outcomes* on those nodes are recomputed (a slot is one node and the op
  sequence a candidate applies to it; its row holds that node's 20 score values after the
  ops). Slots that read the same inputs — instance shape, op sequence, primary node when a
  secondary is removed — share one Python computation per node, and a trailing "add
  secondary" is finished per peer in numpy (`fast_moves.node_outcome`);
- only candidates on those nodes re-derive their per-component Δs/Δq;
- every candidate is re-scored against the new Σx/Σx² in one vectorised pass, with
  `Scoreboard.score_agg`'s formulas and summation order, so near-ties break as there.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import greedy as core
from .fast_moves import N1_COUNT, REMOVE_SEC, RESERVED, RESERVED_TOTAL, node_effects, node_outcome
from .instance import shape
from .metrics import NCOMP

_MAX_NODES = 3  # nodes a move changes


def _grown(arr: np.ndarray, size: int, fill) -> np.ndarray:
    if size <= len(arr):
        return arr
    new = np.full((max(size, 2 * len(arr)), *arr.shape[1:]), fill, dtype=arr.dtype)
    new[: len(arr)] = arr
    return new


def _groups(keys: np.ndarray) -> list[np.ndarray]:
    """Indices of ``keys`` grouped by equal key."""
    order = np.argsort(keys, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(keys[order])) + 1)


class _Slots:
    """Per slot: its node, a code naming the inputs of its computation (equal codes on
    one node give equal outcomes), the peer of a trailing add-secondary (or -1), the
    outcome row (``ok``: the ops succeed), and its difference to the node's current
    values where they count (``mask``, ``d`` = new − old, ``dq`` = new² − old² as
    `Scoreboard.aggregate` computes it; these three in ``layout`` order: standard
    deviations first, then sums, so the re-scoring works on slices, not copies).
    Slot 0 stands for "no node": all zeros."""

    def __init__(self, problem, board: core.Scoreboard) -> None:
        self.problem = problem
        nnodes = len(problem.nodes)
        self.nnodes = nnodes
        kinds = np.array(board.kinds)
        #: ``layout[k]``: the component in position k of ``mask``/``d``/``dq``/``current``.
        self.layout = np.concatenate([np.flatnonzero(kinds == core.STD), np.flatnonzero(kinds == core.SUM)])
        self.nstd = int(np.sum(kinds == core.STD))
        self.current = np.array(board.values, dtype=float)[:, self.layout]
        self.counts = np.array(board.counts, dtype=bool)[:, self.layout]
        self.node = np.zeros(1, dtype=np.int64)
        self.code = np.zeros(1, dtype=np.int64)
        self.peer = np.full(1, -1, dtype=np.int64)
        self.alive = np.zeros(1, dtype=bool)
        self.rows = np.zeros((1, NCOMP))
        self.ok = np.ones(1, dtype=bool)
        self.mask = np.zeros((1, NCOMP), dtype=bool)
        self.d = np.zeros((1, NCOMP))
        self.dq = np.zeros((1, NCOMP))
        self.size = 1
        self.item: list = [None]
        self.ops: list = [None]
        self.by_node: list[list[np.ndarray]] = [[] for _ in range(nnodes)]
        self._codes: dict[tuple, int] = {}
        self._shapes: dict[tuple, int] = {}
        #: Per node, computation code -> `node_outcome`, until the node changes.
        self.cache: list[dict[int, tuple]] = [{} for _ in range(nnodes)]
        #: Per node, the reservation each peer holds on it (the node's ``peers``).
        self.reserved = np.zeros((nnodes, nnodes))
        for idx in range(nnodes):
            self.note_changed(idx, board)

    def note_changed(self, idx: int, board: core.Scoreboard) -> None:
        self.cache[idx] = {}
        self.current[idx] = np.array(board.values[idx])[self.layout]
        row = self.reserved[idx]
        row[:] = 0.0
        for peer, mem in self.problem.nodes[idx].peers.items():
            row[peer] = mem

    def shape_of(self, inst) -> int:
        return self._shapes.setdefault(shape(inst), len(self._shapes))

    def entry(self, item, inst, shape: int, idx: int, ops: tuple) -> tuple:
        """A new slot's ``(node, item, ops, code, peer)``."""
        peer = -1
        key = ops
        if ops[-1][0] == "as":  # its peer is finished in numpy (`_fill`)
            peer = ops[-1][1]
            key = (*ops[:-1], ("as", ops[-1][2]))
        # A secondary's removal reads the instance's primary (its reservation on the node).
        pnode = inst.pnode if REMOVE_SEC in ops else -1
        code = self._codes.setdefault((key, shape, pnode), len(self._codes))
        return idx, item, ops, code, peer

    def add(self, entries: list[tuple]) -> np.ndarray:
        """Append slots (see `entry`); returns their ids."""
        start, end = self.size, self.size + len(entries)
        for name, fill in (("node", 0), ("code", 0), ("peer", -1), ("alive", False), ("ok", False)):
            setattr(self, name, _grown(getattr(self, name), end, fill))
        for name, fill in (("rows", 0.0), ("mask", False), ("d", 0.0), ("dq", 0.0)):
            setattr(self, name, _grown(getattr(self, name), end, fill))
        ids = np.arange(start, end)
        if entries:
            nodes, items, ops, codes, peers = zip(*entries, strict=True)
            self.node[start:end] = nodes
            self.code[start:end] = codes
            self.peer[start:end] = peers
            self.alive[start:end] = True
            self.item.extend(items)
            self.ops.extend(ops)
            for group in _groups(self.node[start:end]):
                self.by_node[int(self.node[start + group[0]])].append(ids[group])
        self.size = end
        return ids

    def live_on(self, idx: int) -> np.ndarray:
        parts = self.by_node[idx]
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        ids = ids[self.alive[ids]]
        self.by_node[idx] = [ids]
        return ids

    def refresh(self, ids: np.ndarray) -> None:
        """Recompute slots ``ids`` (any nodes): one `node_outcome` per node and code."""
        if not len(ids):
            return
        nodes = self.node[ids]
        keys, first, inverse = np.unique(self.code[ids] * self.nnodes + nodes, return_index=True, return_inverse=True)
        problem = self.problem
        results = []
        for key, pos in zip(keys.tolist(), first.tolist(), strict=True):
            code, idx = divmod(key, self.nnodes)
            cache = self.cache[idx]
            result = cache.get(code)
            if result is None:
                slot = int(ids[pos])
                inst = problem.instances[self.item[slot]]
                result = cache[code] = node_outcome(problem.nodes[idx], inst, self.ops[slot])
            results.append(result)
        self._fill(ids, nodes, inverse, results)

    def _fill(self, ids: np.ndarray, nodes: np.ndarray, inverse: np.ndarray, results: list[tuple]) -> None:
        refused = (0.0,) * NCOMP
        rows = np.array([values or refused for values, _ in results])[inverse]
        ok = np.array([values is not None for values, _ in results])[inverse]
        open_peer = np.array([peer is not None for _, peer in results])[inverse]
        if open_peer.any():
            # Finish each trailing add-secondary for its own peer (`fast_moves.node_outcome`).
            info = np.array([peer or (0,) * 7 for _, peer in results], dtype=float)[inverse][open_peer]
            r_mem, free_mem, fail_n1, needed, strict, count, t_mem = info.T
            peem = self.reserved[nodes[open_peer], self.peer[ids[open_peer]]]
            new_rmem = np.maximum(r_mem, peem + needed)
            new_fail = free_mem <= new_rmem
            ok[open_peer] &= ~((strict != 0) & new_fail & (fail_n1 == 0))
            sub = rows[open_peer]
            sub[:, N1_COUNT] = np.where(new_fail, count, 0.0)
            sub[:, RESERVED] = new_rmem / t_mem
            sub[:, RESERVED_TOTAL] = sub[:, RESERVED]
            rows[open_peer] = sub
        self.rows[ids] = rows
        self.ok[ids] = ok
        old = self.current[nodes]
        rows = rows[:, self.layout]
        mask = self.counts[nodes] & (old != rows)
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.where(mask, rows - old, 0.0)
            self.dq[ids] = np.where(mask, (2 * old + d) * d, 0.0)
        self.d[ids] = d
        self.mask[ids] = mask


class _Neighbourhood:
    """Every candidate move, in hbal's order: a block of columns per instance (its moves
    in `possible_moves` order), regenerated when the instance moves. Per-candidate
    arrays are component-major (NCOMP × candidates) so the re-scoring runs on
    contiguous rows."""

    def __init__(self, problem, board: core.Scoreboard) -> None:
        self.problem = problem
        self.board = board
        self.items = list(problem.items())
        self.slots = _Slots(problem, board)
        self.width = 1 + 4 * len(problem.targets)  # most moves an instance can have
        size = self.width * len(self.items)
        self.size = size
        self.slot = np.zeros((size, _MAX_NODES), dtype=np.int64)  # 0: no node
        self.alive = np.zeros(size, dtype=bool)
        self.ok = np.zeros(size, dtype=bool)
        self.layout = self.slots.layout  # component order of the per-candidate rows
        self.nstd = self.slots.nstd
        self.ds = np.zeros((NCOMP, size))
        self.dq = np.zeros((NCOMP, size))
        #: Flat index into the (NCOMP × size) parts: the order `aggregate` sums them in.
        self.gather = np.zeros((NCOMP, size), dtype=np.intp)
        self._part = np.zeros((NCOMP, size))
        self._mean = np.zeros((self.nstd, size))
        self.move: list = [None] * size
        self.item_slots: list[np.ndarray] = [np.zeros(0, np.int64)] * len(self.items)
        self.weights = np.array(board.weights)
        self.evaluations = 0

    def build(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """(Re)generate instance ``pos``'s candidates; returns (their columns, new slots)."""
        problem, slots = self.problem, self.slots
        item = self.items[pos]
        inst = problem.instances[item]
        shape = slots.shape_of(inst)
        slots.alive[self.item_slots[pos]] = False
        lo = pos * self.width
        self.alive[lo : lo + self.width] = False
        self.slot[lo : lo + self.width] = 0
        moves = problem.moves(item)
        local: dict[tuple, int] = {}
        entries = []
        force = problem.opts.ignore_soft_errors
        for j, move in enumerate(moves):
            col = lo + j
            self.move[col] = move
            for k, (idx, ops) in enumerate(node_effects(problem.nodes, inst, move, force)):
                slot = local.get((idx, ops))
                if slot is None:
                    slot = local[(idx, ops)] = slots.size + len(entries)
                    entries.append(slots.entry(item, inst, shape, idx, ops))
                self.slot[col, k] = slot
        ids = slots.add(entries)
        self.item_slots[pos] = ids
        self.alive[lo : lo + len(moves)] = True
        return np.arange(lo, lo + len(moves)), ids

    def derive(self, cols: np.ndarray) -> None:
        """Per candidate in ``cols``: feasibility, Δs/Δq per component (its slots' d/dq
        added left to right, as `aggregate` does; adding an untouched component's 0.0 is
        exact), and the order `aggregate` lists components in: the first node's, then
        new ones of the second, then of the third."""
        self.evaluations += len(cols)
        slots = self.slots
        s0, s1, s2 = self.slot[cols].T
        self.ok[cols] = slots.ok[s0] & slots.ok[s1] & slots.ok[s2]
        d = slots.d
        self.ds[:, cols] = ((d[s0] + d[s1]) + d[s2]).T
        dq = slots.dq
        self.dq[:, cols] = ((dq[s0] + dq[s1]) + dq[s2]).T
        m0, m1, m2 = slots.mask[s0], slots.mask[s1], slots.mask[s2]
        group = np.where(m0, 0, np.where(m1, 1, np.where(m2, 2, 3)))
        order = np.argsort(group, axis=1, kind="stable")
        self.gather[:, cols] = (order * self.size + cols[:, None]).T

    def best(self) -> tuple[int, float] | None:
        """(column, key) of the best candidate: lowest score change, then earliest."""
        if not self.size:
            return None
        keys = self._keys()
        keys[~(self.alive & self.ok) | np.isnan(keys)] = np.inf
        at = int(np.argmin(keys))  # the first of equal minima: hbal's order
        if keys[at] == np.inf:
            return None
        return at, float(keys[at])

    def _keys(self) -> np.ndarray:
        """`Scoreboard.score_agg` − score for every candidate, in the same float
        operations and order."""
        b = self.board
        k = self.nstd
        std, sums = self.layout[:k], self.layout[k:]
        col = np.s_[:, None]
        s, q, n, terms = (np.array(v, dtype=float)[std][col] for v in (b.s, b.q, b.n, b.terms))
        part = self._part
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.add(self.ds[:k], s, out=self._mean)
            mean /= n
            mean *= mean
            var = np.add(self.dq[:k], q, out=part[:k])
            var /= n
            var -= mean
            # w·sqrt(var) if var > 0 else 0.0, as `score_agg`: fmax sends var ≤ 0 and NaN to 0.
            np.fmax(var, 0.0, out=var)
            np.sqrt(var, out=var)
            var *= self.weights[std][col]
            var -= terms
        var[n[:, 0] == 0] = 0.0  # no counted node: the component stays 0
        np.multiply(self.ds[k:], self.weights[sums][col], out=part[k:])
        ordered = part.ravel()[self.gather]
        total = np.full(self.size, b.score)
        for row in ordered:
            total += row
        return total - b.score

    def changes(self, col: int) -> list[tuple[int, tuple[float, ...]]]:
        slots = self.slots
        return [(int(slots.node[slot]), tuple(slots.rows[slot].tolist())) for slot in self.slot[col].tolist() if slot]


def steepest_descent(
    problem,
    board: core.Scoreboard,
    rule: core.GainRule,
    on_step: Callable[[core.Applied], None] | None = None,
) -> core.GreedyStats:
    """Apply the best move until none passes ``rule`` (see the module docstring)."""
    hood = _Neighbourhood(problem, board)
    stats = core.GreedyStats(full_passes=1)
    new = [hood.build(pos)[1] for pos in range(len(hood.items))]
    hood.slots.refresh(np.concatenate(new) if new else np.zeros(0, np.int64))
    hood.derive(np.flatnonzero(hood.alive))
    while True:
        if rule.max_moves >= 0 and len(stats.moves) >= rule.max_moves:
            break
        if board.score <= rule.min_score:
            break
        best = hood.best()
        if best is None or not rule.accepts(board.score, board.score + best[1]):
            break
        col = best[0]
        pos = col // hood.width
        ev = core.Evaluation(hood.changes(col))
        item, move = hood.items[pos], hood.move[col]
        problem.apply(item, move, ev)
        board.apply(ev.changes)
        _refresh_after(hood, pos, sorted(ev.payload[0]))
        step = core.Applied(item, move, board.score, ev.payload)
        stats.moves.append(step)
        if on_step is not None:
            on_step(step)
    stats.evaluations = hood.evaluations
    return stats


def _refresh_after(hood: _Neighbourhood, pos: int, changed: list[int]) -> None:
    """Bring outcomes and candidates up to date after a move changed nodes ``changed``."""
    slots = hood.slots
    for idx in changed:
        slots.note_changed(idx, hood.board)
    cols, new_slots = hood.build(pos)
    # Changed nodes: all their slots (the new ones among them). Elsewhere: the new ones.
    on_changed = np.zeros(slots.nnodes, dtype=bool)
    on_changed[changed] = True
    elsewhere = new_slots[~on_changed[slots.node[new_slots]]]
    slots.refresh(np.concatenate([*(slots.live_on(idx) for idx in changed), elsewhere]))
    touched = (on_changed[slots.node[hood.slot]] & (hood.slot > 0)).any(axis=1) & hood.alive
    touched[cols] = True
    hood.derive(np.flatnonzero(touched))
