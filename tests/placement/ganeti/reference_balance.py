"""A slow, plain steepest descent: the reference `steepest.steepest_descent` is held to.

It is `greedy.greedy_balance` with one addition: after each move the candidates touching a
changed node are evaluated afresh and every other one is re-keyed against the new sums,
so each move is the best of the whole neighbourhood, ties to the earliest instance and
its earliest move (hbal's order). Test-only: the product runs the vectorised version.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable

from placement.ganeti.greedy import Applied, BalanceProblem, GainRule, GreedyStats, Scoreboard

# heap entry layout
_KEY, _ORDER, _SEQ, _EPOCH, _ITEM, _MOVE, _NODES, _SNAP, _IVER, _EV, _DELTAS, _AGG = range(12)


def steepest_balance(  # noqa: C901 (the reference stays one plain loop, as Ganeti's tryBalance reads)
    problem: BalanceProblem,
    board: Scoreboard,
    rule: GainRule,
    on_step: Callable[[Applied], None] | None = None,
    steepest: bool = True,
) -> GreedyStats:
    """``steepest``: after each move, re-evaluate the candidates it touched and re-key all
    others, so each move is the best one (hbal's steepest descent; slower). Otherwise
    candidates are re-keyed lazily."""
    stats = GreedyStats()
    versions: dict[int, int] = {}
    item_version: dict[Hashable, int] = {}
    state = {"epoch": 0, "seq": 0}
    heap: list = []
    # Infeasible candidates, by node: re-tried when one of their nodes changes.
    parked: dict[int, list] = {}

    def push(item, move, order):
        ev = problem.evaluate(item, move)
        stats.evaluations += 1
        nodes = tuple(problem.involved(item, move))
        if ev is None:
            ticket = (item, move, order, item_version.get(item, 0))
            for n in nodes:
                parked.setdefault(n, []).append(ticket)
            return
        snap = tuple(versions.get(n, 0) for n in nodes)
        deltas = board.deltas(ev.changes)
        agg = board.aggregate(deltas)
        state["seq"] += 1
        key = board.score_agg(agg) - board.score
        entry = [
            key,
            order,
            state["seq"],
            state["epoch"],
            item,
            move,
            nodes,
            snap,
            item_version.get(item, 0),
            ev,
            deltas,
            agg,
        ]
        heapq.heappush(heap, entry)

    def estimate(entry) -> float:
        # Exact while its nodes are unchanged; else re-derived from the per-node deltas.
        if entry[_SNAP] != tuple(versions.get(n, 0) for n in entry[_NODES]):
            entry[_AGG] = board.aggregate(entry[_DELTAS])
        return board.score_agg(entry[_AGG]) - board.score

    def rekey(entry):
        state["seq"] += 1
        entry[_KEY] = estimate(entry)
        entry[_SEQ] = state["seq"]
        entry[_EPOCH] = state["epoch"]
        heapq.heappush(heap, entry)
        stats.rekeyed += 1

    def rekey_all():
        """Re-estimate every queued candidate (no re-evaluation)."""
        epoch = state["epoch"]
        for entry in heap:
            entry[_KEY] = estimate(entry)
            entry[_EPOCH] = epoch
        heapq.heapify(heap)
        stats.rekeyed += len(heap)

    # Per item, the order of its first candidate in the last full pass (see below).
    first_order: dict[Hashable, int] = {}

    def full_pass():
        heap.clear()
        parked.clear()
        stats.full_passes += 1
        order = 0
        for item in problem.items():
            first_order[item] = order
            for move in problem.moves(item):
                push(item, move, order)
                order += 1

    full_pass()
    verified = False
    refreshed = True
    while True:
        if rule.max_moves >= 0 and len(stats.moves) >= rule.max_moves:
            break
        if board.score <= rule.min_score:
            break
        entry = heapq.heappop(heap) if heap else None
        if entry is not None and entry[_IVER] != item_version.get(entry[_ITEM], 0):
            continue  # the item moved since; its candidates were regenerated
        if entry is not None and entry[_EPOCH] != state["epoch"]:
            rekey(entry)  # judge it on today's sums
            continue
        if entry is not None and entry[_SNAP] != tuple(versions.get(n, 0) for n in entry[_NODES]):
            push(entry[_ITEM], entry[_MOVE], entry[_ORDER])  # a node changed: exact again
            continue
        if entry is None or not rule.accepts(board.score, board.score + entry[_KEY]):
            if entry is not None:
                heapq.heappush(heap, entry)
            if not refreshed:
                # Keys of candidates deep in the queue may have gone stale (better): refresh.
                rekey_all()
                refreshed = True
                continue
            if verified:
                break
            full_pass()
            verified = True
            continue
        item, move, ev = entry[_ITEM], entry[_MOVE], entry[_EV]
        problem.apply(item, move, ev)
        board.apply(ev.changes)
        state["epoch"] += 1
        verified = False
        refreshed = False
        touched = {*entry[_NODES], *(node for node, _ in ev.changes)}
        for n in touched:
            versions[n] = versions.get(n, 0) + 1
        item_version[item] = item_version.get(item, 0) + 1
        if steepest:
            # Exact steepest descent, as hbal: candidates touching a changed node are
            # evaluated afresh; every other one keeps its per-node deltas (its nodes did
            # not change), so re-keying it against the new sums is exact.
            kept, stale = [], []
            for queued in heap:
                if queued[_IVER] != item_version.get(queued[_ITEM], 0):
                    continue
                if touched.isdisjoint(queued[_NODES]):
                    kept.append(queued)
                else:
                    stale.append(queued)
            heap[:] = kept
            epoch = state["epoch"]
            for queued in kept:  # nodes unchanged: the cached aggregate still holds
                queued[_KEY] = board.score_agg(queued[_AGG]) - board.score
                queued[_EPOCH] = epoch
            heapq.heapify(heap)
            stats.rekeyed += len(kept)
            for queued in stale:
                push(queued[_ITEM], queued[_MOVE], queued[_ORDER])
        retry = {}
        for n in touched:
            for ticket in parked.pop(n, ()):
                retry[(ticket[0], id(ticket[1]))] = ticket
        for t_item, t_move, t_order, t_iver in retry.values():
            if t_iver == item_version.get(t_item, 0):
                push(t_item, t_move, t_order)
        step = Applied(item, move, board.score, ev.payload)
        stats.moves.append(step)
        if on_step is not None:
            on_step(step)
        new_moves = list(problem.moves(item))
        for j, new_move in enumerate(new_moves):
            if steepest:
                # Ties go to the earliest item, then its earliest move (hbal's order): the
                # new moves stay within the item's band of orders, in their own order.
                push(item, new_move, first_order[item] + j / (len(new_moves) + 1))
            else:
                push(item, new_move, entry[_ORDER])
        refreshed = refreshed or steepest
    return stats
