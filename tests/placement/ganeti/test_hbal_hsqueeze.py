"""Balancing and consolidation on the Ganeti model, against Ganeti's own tools."""

import random
import re
import subprocess
from pathlib import Path

import pytest

from placement.ganeti import text_backend
from placement.ganeti.fast_moves import move_values, node_effects, node_values_after
from placement.ganeti.generate import consistent_free_memory, unbalanced_cluster
from placement.ganeti.hbal import HbalOptions, balance
from placement.ganeti.hsqueeze import squeeze
from placement.ganeti.metrics import node_values
from placement.ganeti.moves import apply_move, possible_moves
from placement.ganeti.types import AllocFailure

from ..helpers import ganeti_tool

DATA = Path(__file__).resolve().parents[2] / "data" / "placement" / "ganeti"


def hinfo_score(path) -> float:
    out = subprocess.run([ganeti_tool("hinfo"), "-t", str(path), "--ignore-dynu"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.strip().splitlines()[-1].split()[-1])


def test_our_hbal_ends_no_worse_than_ganetis(tmp_path):
    src = DATA / "drbd-8-nodes.txt"
    done = subprocess.run(
        [ganeti_tool("hbal"), "-t", str(src), "--ignore-dynu", "-S", str(tmp_path / "g")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    # Saved files keep the free memory they were loaded with; make both consistent so
    # hinfo measures the state the moves produced.
    theirs = consistent_free_memory(text_backend.parse((tmp_path / "g.balanced").read_text()))
    (tmp_path / "theirs.txt").write_text(text_backend.serialize(theirs))
    result = balance(text_backend.parse(src.read_text(), ignore_dynu=True))
    (tmp_path / "ours.txt").write_text(text_backend.serialize(consistent_free_memory(result.cluster)))
    our_score = hinfo_score(tmp_path / "ours.txt")
    assert our_score == pytest.approx(result.final_score, abs=1e-8)
    assert our_score <= hinfo_score(tmp_path / "theirs.txt") + 1e-9
    assert result.final_score < result.initial_score
    assert all(c.startswith("gnt-instance ") for c in result.commands())


def test_hbal_never_moves_onto_offline_nodes_and_honours_max_moves():
    cluster = unbalanced_cluster(6, 30, seed=5)
    offline = cluster.nodes[5].name
    unlimited = balance(cluster, HbalOptions(offline=(offline,)))
    assert len(unlimited.steps) > 4  # there are moves to make, more than the limit
    result = balance(cluster, HbalOptions(offline=(offline,), max_moves=4))
    assert len(result.steps) == 4
    assert sum(offline in step.old_nodes for step in unlimited.steps) > 0  # instances leave it...
    for step in unlimited.steps + result.steps:  # ...and none arrives
        assert offline not in step.new_nodes or offline in step.old_nodes


def test_evacuation_mode_empties_an_offline_node():
    cluster = unbalanced_cluster(5, 20, seed=6)
    gone = cluster.nodes[0].name
    result = balance(cluster, HbalOptions(offline=(gone,), evac_mode=True, min_gain=0.0))
    node = result.cluster.nodes[0]
    assert not node.plist and result.steps


def test_fast_move_evaluation_equals_applying_the_move():
    rng = random.Random(7)
    cluster = unbalanced_cluster(7, 40, seed=7)
    checked = 0
    for inst in rng.sample(cluster.instances, 15):
        targets = [n.idx for n in cluster.nodes if n.idx not in (inst.pnode, inst.snode)]
        for move in possible_moves(inst, targets, secondary_ok=True):
            for force in (False, True):
                try:
                    changed, _ = apply_move(cluster.nodes, inst, move, force)
                    expected = {i: node_values(n) for i, n in changed.items()}
                except AllocFailure as exc:
                    expected = exc.mode
                try:
                    got = move_values(cluster.nodes, inst, move, force)
                except AllocFailure as exc:
                    got = exc.mode
                assert got == expected
                checked += 1
    assert checked > 500


def test_per_node_move_effects_compose_to_the_whole_move():
    # hbal memoises each node's outcome separately; together they must be the move.
    cluster = unbalanced_cluster(7, 40, seed=3)
    nodes = cluster.nodes
    checked = 0
    for inst in cluster.instances:
        targets = [t for t in range(len(nodes)) if t not in (inst.pnode, inst.snode)]
        for move in possible_moves(inst, targets, secondary_ok=True):
            for force in (False, True):
                try:
                    expected = list(move_values(nodes, inst, move, force).items())
                except AllocFailure:
                    expected = None
                try:
                    got = [
                        (idx, node_values_after(nodes[idx], inst, ops))
                        for idx, ops in node_effects(nodes, inst, move, force)
                    ]
                except AllocFailure:
                    got = None
                assert got == expected
                checked += 1
    assert checked > 1000


def test_steepest_descent_takes_ganetis_exact_path():
    src = DATA / "drbd-8-nodes.txt"
    done = subprocess.run([ganeti_tool("hbal"), "-t", str(src), "--ignore-dynu"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    line = re.compile(r"\s+\d+\. (\S+) \S+ => (\S+)\s+([\d.]+) a=(.*)$")
    theirs = [m.groups() for m in map(line.match, done.stdout.splitlines()) if m]
    result = balance(text_backend.parse(src.read_text(), ignore_dynu=True), HbalOptions(strategy="steepest"))
    ours = [(s.instance, ":".join(s.new_nodes), f"{s.score:.8f}", s.move) for s in result.steps]
    assert len(theirs) > 10
    assert ours == [(i, n, sc, a.strip()) for i, n, sc, a in theirs]


def test_hsqueeze_offlines_the_same_nodes_as_ganeti():
    path = DATA / "ext-6-nodes.txt"
    done = subprocess.run([ganeti_tool("hsqueeze"), "-t", str(path), "--no-headers"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = squeeze(text_backend.parse(path.read_text()))
    assert result.action == "offline"
    assert result.nodes == done.stdout.split()
    assert all(not result.cluster.nodes[result.cluster.node_index(n)].plist for n in result.nodes)
