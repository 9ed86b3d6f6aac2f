"""The fast forms of Ganeti's node checks agree with the scalar one (`node.pri_added`,
`node.sec_added`, through `Node.add_pri`/`add_sec`) on generated clusters that have
exclusive storage, exclusion tags, offline nodes and instances, and forthcoming instances:

- `quick_checks.numpy_failures` (every node at once) and `scalar_failures` against `Node.add_pri`;
- `fast_moves.move_values` (scratch records) against `moves.apply_move` + `node_values`;
- `fast_moves.node_outcome` + `steepest`'s per-peer finish against `node_values_after`;
- `steepest.steepest_descent` against the plain reference on the same clusters.
"""

import random
from collections import Counter

import pytest

from placement.ganeti import fast_moves, hbal
from placement.ganeti import types as T
from placement.ganeti.fast_moves import move_values, node_effects, node_outcome, node_values_after
from placement.ganeti.hbal import HbalOptions
from placement.ganeti.metrics import node_values
from placement.ganeti.moves import apply_move, possible_moves
from placement.ganeti.quick_checks import numpy_failures, scalar_failures

from .reference_balance import steepest_balance
from .test_steepest import _assert_same, _finish
from .varied import TEMPLATES, probe, stats, varied_cluster

SEEDS = range(1, 9)


def test_the_generated_clusters_cover_every_case():
    total = Counter()
    for seed in SEEDS:
        total.update(stats(varied_cluster(seed)))
    assert all(total[k] > 0 for k in ("exclusive", "offline_nodes", "forthcoming", "tagged", "offline_instances"))
    assert total["overhead"] > 0


def _outcome(call, *args):
    try:
        return call(*args)
    except T.AllocFailure as failure:
        return failure.mode
    except ZeroDivisionError:
        return "zero cpus"


@pytest.mark.parametrize("seed", SEEDS)
def test_array_checks_fail_exactly_as_add_pri(seed):
    rng = random.Random(seed)
    cluster = varied_cluster(seed)
    nodes = [n for n in cluster.nodes if not n.offline]
    seen = Counter()
    for _ in range(60):
        inst = probe(rng, rng.choice(TEMPLATES), forthcoming=rng.random() < 0.2)
        quick = numpy_failures(nodes, inst, [None] * len(nodes))
        assert scalar_failures(nodes, inst, [None] * len(nodes)) == quick
        for node, mode in zip(nodes, quick, strict=True):
            actual = _outcome(node.add_pri, inst)
            actual = None if isinstance(actual, type(node)) else actual
            if mode is not None:
                assert actual == mode, (node, inst, mode, actual)
            seen[mode is not None] += 1
    assert seen[True] > 0 and seen[False] > 0


def _applied(nodes, inst, move, force):
    changed, _ = apply_move(nodes, inst, move, force)
    return {i: node_values(n) for i, n in changed.items()}


@pytest.mark.parametrize("seed", SEEDS)
def test_scratch_moves_equal_applying_the_move(seed):
    cluster = varied_cluster(seed)
    nodes, checked = cluster.nodes, Counter()
    for inst in cluster.instances:
        if not inst.movable:
            continue
        targets = [n.idx for n in nodes if n.idx not in (inst.pnode, inst.snode)]
        for move in possible_moves(inst, targets, secondary_ok=True):
            for force in (False, True):
                expected = _outcome(_applied, nodes, inst, move, force)
                assert _outcome(move_values, nodes, inst, move, force) == expected
                checked[(inst.forthcoming, isinstance(expected, dict))] += 1
    assert checked[(False, True)] > 0 and checked[(False, False)] > 0
    assert checked[(True, True)] + checked[(True, False)] > 0  # forthcoming instances move too


@pytest.mark.parametrize("seed", SEEDS)
def test_node_outcomes_finish_like_node_values_after(seed):
    cluster = varied_cluster(seed)
    nodes = cluster.nodes
    for inst in cluster.instances:
        if not inst.movable:
            continue
        targets = [t for t in range(len(nodes)) if t not in (inst.pnode, inst.snode)]
        for move in possible_moves(inst, targets, secondary_ok=True):
            for force in (False, True):
                for idx, ops in node_effects(nodes, inst, move, force):
                    expected = _outcome(node_values_after, nodes[idx], inst, ops)
                    expected = None if not isinstance(expected, tuple) else expected
                    values, peer = node_outcome(nodes[idx], inst, ops)
                    peem = nodes[idx].peers.get(ops[-1][1], 0) if peer is not None else 0
                    assert _finish(values, peer, peem) == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_steepest_descent_takes_the_reference_path(seed):
    cluster = varied_cluster(seed)
    opts = HbalOptions(strategy="steepest")
    scope = hbal._scope(cluster, opts.group)
    fast = hbal._run(cluster, scope, opts, steepest=True)
    slow = hbal._run(cluster, scope, opts, steepest=True, search=steepest_balance)
    assert len(slow.steps) > 0
    _assert_same(fast, slow)


def test_a_secondary_outcome_kept_by_reservation_is_the_primarys_own():
    # hspace's pairs keep a secondary's outcome under the memory its primary already
    # reserves on it (not under the primary): primaries reserving as much share it.
    from placement.ganeti import fast_moves
    from placement.ganeti.instance import shape

    shared = Counter()
    for seed in SEEDS:
        cluster = varied_cluster(seed)
        rng = random.Random(seed)
        for _ in range(6):
            inst = probe(rng, "drbd", forthcoming=rng.random() < 0.2)
            key = (False, *shape(inst))
            for node in cluster.nodes:
                node.outcomes = None
                for p in cluster.nodes:
                    if p.idx == node.idx:
                        continue
                    kept = fast_moves.secondary_outcome(node, inst, p.idx, key)
                    try:
                        own = node_values_after(node, inst, (("as", p.idx, False),))
                    except T.AllocFailure as exc:
                        own = exc.mode
                    assert kept == own
                shared[len(node.outcomes) < len(cluster.nodes) - 1] += 1
    assert shared[True] > 20, shared  # primaries that reserve as much shared an outcome


def test_hspace_pairs_answer_alike_with_outcomes_kept_by_primary(monkeypatch):
    from placement.ganeti import fast_moves
    from placement.ganeti.hspace import HSpaceOptions, Spec, run_hspace
    from placement.ganeti.simulate import simulated_cluster

    for nodes, tiered, standard in (
        ("p,3,34052480,65523,24", "1048576,1024,8", None),
        ("p,4,400000,32768,16", "51200,8192,4", "10240,2048,1"),
    ):
        answers = []
        for by_reservation in (True, False):
            monkeypatch.setattr(fast_moves, "_BY_RESERVATION", [by_reservation])
            opts = HSpaceOptions(
                disk_template="drbd",
                tiered=Spec.parse(tiered),
                standard=Spec.parse(standard) if standard else None,
            )
            answers.append(run_hspace(simulated_cluster([nodes]), opts).hts_lines())
        assert answers[0] == answers[1]


def test_secondary_outcomes_finished_from_another_primarys_equal_their_own():
    # A node's add as a secondary differs between primaries only in what they already
    # reserve there: finished from another primary's outcome (`templates`), it is the add
    # replayed for this one, refusals included.
    from placement.ganeti import fast_moves
    from placement.ganeti.instance import outcome_key

    finished = Counter()
    for seed in SEEDS:
        cluster = varied_cluster(seed)
        rng = random.Random(seed)
        for _ in range(6):
            inst = probe(rng, "drbd", forthcoming=rng.random() < 0.2)
            key = outcome_key(False, inst)
            for node in cluster.nodes:
                node.outcomes = None
                templates = {}
                for p in cluster.nodes:
                    if p.idx == node.idx:
                        continue
                    had = node.idx in templates and not inst.forthcoming
                    kept = fast_moves.secondary_outcome(node, inst, p.idx, key, templates)
                    try:
                        own = node_values_after(node, inst, (("as", p.idx, False),))
                    except T.AllocFailure as exc:
                        own = exc.mode
                    assert kept == own
                    finished[had, kept.__class__ is tuple] += 1
    assert finished[True, True] > 20, finished
    # And a refusal: what one primary reserves tips the node into N+1 failure, not the other's.
    from placement.ganeti.instance import Instance
    from placement.ganeti.simulate import simulated_cluster

    nodes = list(simulated_cluster(["p,3,100000,4096,8"]).nodes)
    a = Instance("a", 1500, 1024, 1, "running", True, 0, 2, "drbd", [], 1, None, idx=0)
    b = Instance("b", 1000, 1024, 1, "running", True, 2, 1, "drbd", [], 1, None, idx=1)
    nodes[0], nodes[2] = nodes[0].add_pri(a), nodes[2].add_sec(a, 0)
    nodes[2], nodes[1] = nodes[2].add_pri(b), nodes[1].add_sec(b, 2)
    new = Instance("new", 2100, 1024, 1, "running", True, -1, -1, "drbd", [], 1, None, idx=2)
    templates = {}
    key = outcome_key(False, new)
    assert fast_moves.secondary_outcome(nodes[2], new, 1, key, templates).__class__ is tuple
    assert fast_moves.secondary_outcome(nodes[2], new, 0, key, templates) == T.FailMode.MEM
    with pytest.raises(T.AllocFailure) as refused:
        node_values_after(nodes[2], new, (("as", 0, False),))
    assert refused.value.mode == T.FailMode.MEM


def test_outcome_keys_name_one_shape_each_even_after_the_table_is_emptied(monkeypatch):
    from placement.ganeti import instance
    from placement.ganeti.instance import Instance, outcome_key

    monkeypatch.setattr(instance, "_OUTCOME_KEYS", {})
    monkeypatch.setattr(instance, "_OUTCOME_KEYS_MAX", 3)
    shapes = [
        Instance("i", mem, 1024, 1, "running", True, -1, -1, "drbd", [], 1, None) for mem in range(128, 1152, 128)
    ]
    keys = [outcome_key(False, i) for i in shapes]
    assert len(set(keys)) == len(shapes)  # the table was emptied twice on the way
    assert outcome_key(False, shapes[-1]) == keys[-1] and outcome_key(True, shapes[-1]) != keys[-1]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_single_add_without_a_scratch_record_equals_its_replay(seed):
    # `node_values_after` of one add reads the node itself instead of a scratch copy of
    # it (`fast_moves._single_add`): the same values, the same refusals, on nodes with
    # exclusive storage, tags, offline and forthcoming instances, forced or not.
    rng = random.Random(seed)
    cluster = varied_cluster(seed)
    nodes = cluster.nodes
    seen = Counter()
    for _ in range(40):
        inst = probe(rng, rng.choice(TEMPLATES), forthcoming=rng.random() < 0.2)
        for node in nodes:
            peer = rng.choice([n.idx for n in nodes if n.idx != node.idx])
            for op in (("ap", False), ("ap", True), ("as", peer, False), ("as", peer, True)):

                def replayed(node=node, inst=inst, op=op):
                    scratch = fast_moves._Scratch(node)
                    fast_moves._replay(scratch, inst, op)
                    return scratch.values()

                expected = _outcome(replayed)
                actual = _outcome(node_values_after, node, inst, (op,))
                if isinstance(expected, tuple):  # to the bit (NaN included)
                    assert [v.hex() for v in actual] == [v.hex() for v in expected], (node, inst, op)
                else:
                    assert actual == expected, (node, inst, op)
                seen[(op[0], isinstance(expected, tuple))] += 1
    assert all(seen[(kind, ok)] > 0 for kind in ("ap", "as") for ok in (True, False)), seen
