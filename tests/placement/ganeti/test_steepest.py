"""The vectorised steepest descent against the pure-Python one it replaces.

The small clusters run both searches here. The larger ones (the plain loop needs seconds to a
minute each) are held to the reference's path as recorded in ``steepest-reference.json``, which
``python -m tests.placement.ganeti.test_steepest`` writes again from the reference itself."""

import json
import random
import re
import subprocess
from pathlib import Path

import pytest

from placement.ganeti import hbal, text_backend
from placement.ganeti.fast_moves import (
    N1_COUNT,
    RESERVED,
    RESERVED_TOTAL,
    node_effects,
    node_outcome,
    node_values_after,
)
from placement.ganeti.generate import unbalanced_cluster
from placement.ganeti.hbal import HbalOptions
from placement.ganeti.moves import possible_moves
from placement.ganeti.types import AllocFailure

from ..helpers import ganeti_tool
from .reference_balance import steepest_balance

DATA = Path(__file__).resolve().parents[2] / "data" / "placement" / "ganeti"
RECORDED = DATA / "steepest-reference.json"


def _steps(result):
    return [(s.instance, s.move, s.old_nodes, s.new_nodes, s.score) for s in result.steps]


def _both(cluster, **options):
    """(vectorised, reference) runs of the steepest strategy, set up as `hbal.balance` does."""
    opts = HbalOptions(strategy="steepest", **options)
    if opts.offline:
        cluster = cluster.set_offline(opts.offline)
    scope = hbal._scope(cluster, opts.group)
    fast = hbal._run(cluster, scope, opts, steepest=True)
    slow = hbal._run(cluster, scope, opts, steepest=True, search=steepest_balance)
    return fast, slow


def _path(result):
    """What the two searches must agree on, as JSON keeps it (tuples as lists)."""
    return json.loads(
        json.dumps({
            "steps": _steps(result),
            "final_score": result.final_score,
            "placement": [(i.pnode, i.snode) for i in result.cluster.instances],
        })
    )  # fmt: skip


def _assert_same(fast, slow):
    assert _steps(fast) == _steps(slow)
    assert fast.final_score == slow.final_score
    assert [(i.pnode, i.snode) for i in fast.cluster.instances] == [(i.pnode, i.snode) for i in slow.cluster.instances]


def _fast(cluster, **options):
    opts = HbalOptions(strategy="steepest", **options)
    if opts.offline:
        cluster = cluster.set_offline(opts.offline)
    return hbal._run(cluster, hbal._scope(cluster, opts.group), opts, steepest=True)


def _recorded_cases():
    """``{name: (cluster, options)}``: the larger cases, whose reference path is recorded."""
    offline = _generated(8, 50, 7).nodes[0].name
    return {
        "generated-9-70-4": (_generated(9, 70, 4), {}),
        "generated-12-60-5": (_generated(12, 60, 5), {}),
        "generated-10-100-10": (_generated(10, 100, 10), {}),
        "ganeti-drbd-8-nodes": (
            text_backend.parse((DATA / "drbd-8-nodes.txt").read_text(), ignore_dynu=True),
            {},
        ),
        "max-moves-4": (_generated(8, 50, 6), {"max_moves": 4}),
        "offline": (_generated(8, 50, 7), {"offline": (offline,)}),
        "offline-evacuation": (_generated(8, 50, 7), {"offline": (offline,), "evac_mode": True}),
        "min-gain": (_generated(8, 50, 8), {"min_gain": 0.05, "min_gain_limit": 1.0}),
        "ignore-soft-errors": (_generated(8, 50, 8), {"ignore_soft_errors": True}),
    }


def _recorded(name):
    return json.loads(RECORDED.read_text())[name]


def record():
    """Run the reference on every recorded case and write what it did (minutes)."""
    paths = {name: _path(_both(cluster, **options)[1]) for name, (cluster, options) in _recorded_cases().items()}
    cases = [
        f'{json.dumps(name)}: {{"final_score": {json.dumps(path["final_score"])},'
        f' "placement": {json.dumps(path["placement"])}, "steps": [\n  '
        + ",\n  ".join(json.dumps(step) for step in path["steps"])
        + "\n]}"
        for name, path in paths.items()
    ]
    RECORDED.write_text("{\n" + ",\n".join(cases) + "\n}\n")


def test_the_recorded_cases_are_the_ones_recorded():
    assert set(json.loads(RECORDED.read_text())) == set(_recorded_cases())


RECORDED_CASES = (
    "generated-9-70-4",
    "generated-12-60-5",
    "generated-10-100-10",
    "ganeti-drbd-8-nodes",
    "min-gain",
    "ignore-soft-errors",
)


@pytest.mark.parametrize("name", RECORDED_CASES)
def test_takes_the_recorded_reference_path(name):
    cluster, options = _recorded_cases()[name]
    fast = _fast(cluster, **options)
    assert fast.steps
    assert _path(fast) == _recorded(name)


def _generated(nodes, instances, seed, template="drbd"):
    cluster = unbalanced_cluster(nodes, instances, seed=seed, template=template)
    return text_backend.parse(text_backend.serialize(cluster), ignore_dynu=True)


@pytest.mark.parametrize(
    ("nodes", "instances", "seed"),
    [(4, 12, 1), (6, 30, 2), (8, 50, 3)],
)
def test_takes_the_reference_path(nodes, instances, seed):
    fast, slow = _both(_generated(nodes, instances, seed))
    assert len(slow.steps) > 0
    _assert_same(fast, slow)


def test_stops_after_max_moves():
    cluster, options = _recorded_cases()["max-moves-4"]
    fast = _fast(cluster, **options)
    assert len(fast.steps) == 4
    assert _path(fast) == _recorded("max-moves-4")


def test_offline_node_and_evacuation():
    cases = _recorded_cases()
    cluster, options = cases["offline"]
    fast = _fast(cluster, **options)
    assert _path(fast) == _recorded("offline")
    assert all(options["offline"][0] not in s.new_nodes for s in fast.steps)
    cluster, options = cases["offline-evacuation"]
    fast = _fast(cluster, **options)
    assert len(fast.steps) > 0
    assert _path(fast) == _recorded("offline-evacuation")


def test_nothing_to_move():
    cluster = _generated(6, 30, 2)
    fast, slow = _both(cluster, evac_mode=True)  # no offline node: nothing to evacuate
    assert fast.steps == slow.steps == []
    assert fast.final_score == slow.final_score


def test_shared_storage_instances():
    fast, slow = _both(_generated(6, 30, 9, template="ext"))
    assert len(slow.steps) > 0
    _assert_same(fast, slow)


def test_ties_break_as_ganeti(tmp_path):
    # Here two targets of one instance give the very same score (move 38); hbal takes the
    # earlier one. (The reference used to take whichever its heap held first.)
    path = tmp_path / "in.txt"
    path.write_text(text_backend.serialize(unbalanced_cluster(10, 75, seed=343891, skew=1.0)))
    done = subprocess.run(
        [ganeti_tool("hbal"), "-t", str(path), "--ignore-dynu", "-O", "node009"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    line = re.compile(r"\s+\d+\. (\S+) \S+ => (\S+)\s+([\d.]+) a=(.*)$")
    theirs = [
        (i, n, sc, a.strip()) for i, n, sc, a in (m.groups() for m in map(line.match, done.stdout.splitlines()) if m)
    ]
    # Against hbal itself (the reference, a plain loop, needs half a minute for this cluster and
    # is held to the vectorised search on the smaller ones above).
    cluster = text_backend.parse(path.read_text(), ignore_dynu=True).set_offline(("node009",))
    opts = HbalOptions(strategy="steepest", offline=("node009",))
    fast = hbal._run(cluster, hbal._scope(cluster, opts.group), opts, steepest=True)
    assert [(s.instance, ":".join(s.new_nodes), f"{s.score:.8f}", s.move) for s in fast.steps] == theirs
    assert len(theirs) > 40


def test_balance_uses_it():
    cluster = _generated(6, 30, 2)
    result = hbal.balance(cluster, HbalOptions(strategy="steepest"))
    assert _steps(result) == _steps(_both(cluster)[1])


def _finish(values, peer, peem):
    """`node_outcome`'s contract, spelled out in Python for one peer."""
    if values is None or peer is None:
        return values
    r_mem, free_mem, fail_n1, needed, strict, count, t_mem = peer
    reserved = max(r_mem, peem + needed)
    fails = free_mem <= reserved
    if strict and fails and not fail_n1:
        return None
    out = list(values)
    out[N1_COUNT] = float(count) if fails else 0.0
    out[RESERVED] = out[RESERVED_TOTAL] = reserved / t_mem
    return tuple(out)


def test_node_outcome_finishes_like_node_values_after():
    rng = random.Random(3)
    cluster = _generated(7, 60, 11)
    nodes, checked, open_peers = cluster.nodes, 0, 0
    for inst in rng.sample(cluster.instances, 25):
        targets = [t for t in range(len(nodes)) if t not in (inst.pnode, inst.snode)]
        for move in possible_moves(inst, targets, secondary_ok=True):
            for force in (False, True):
                for idx, ops in node_effects(nodes, inst, move, force):
                    try:
                        expected = node_values_after(nodes[idx], inst, ops)
                    except AllocFailure:
                        expected = None
                    values, peer = node_outcome(nodes[idx], inst, ops)
                    peem = nodes[idx].peers.get(ops[-1][1], 0) if peer is not None else 0
                    assert _finish(values, peer, peem) == expected
                    checked += 1
                    open_peers += peer is not None
    assert checked > 1000 and open_peers > 300


if __name__ == "__main__":
    record()
