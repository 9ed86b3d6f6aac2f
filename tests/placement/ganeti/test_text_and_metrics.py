"""The htools text format round-trips, and our score equals hinfo's, term for term."""

import random
import subprocess
from pathlib import Path

import pytest

from placement.ganeti import metrics, text_backend
from placement.ganeti.generate import unbalanced_cluster
from placement.ganeti.simulate import parse_unit, simulated_cluster
from placement.ganeti.types import AllocFailure

from ..helpers import ganeti_tool

DATA = Path(__file__).resolve().parents[2] / "data" / "placement" / "ganeti"
FILES = sorted(DATA.glob("*.txt"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_it_round_trips_the_text_backend(path):
    text = path.read_text()
    assert text_backend.serialize(text_backend.parse(text)) == text


def test_it_rejects_malformed_files():
    with pytest.raises(text_backend.TextFormatError, match="sections"):
        text_backend.parse("only|one|section\n")
    good = (DATA / "mixed-states.txt").read_text()
    with pytest.raises(text_backend.TextFormatError, match="Unknown node"):
        text_backend.parse(good.replace("|node-01-003||plain", "|node-99||plain"))


def hinfo_terms(path, ignore_dynu=True):
    args = [ganeti_tool("hinfo"), "-t", str(path), "-v", "-v"]
    out = subprocess.run(args + (["--ignore-dynu"] if ignore_dynu else []), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Cluster coefficients"))
    terms = {}
    for line in lines[start + 2 :]:
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("x"):
            break
        terms[parts[0]] = float(parts[1])
    score = float(lines[-1].split()[-1])
    return terms, score


@pytest.mark.parametrize("ignore_dynu", [True, False])
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_our_score_equals_hinfos(path, ignore_dynu, tmp_path):
    cluster = text_backend.parse(path.read_text(), ignore_dynu=ignore_dynu)
    theirs, their_score = hinfo_terms(path, ignore_dynu)
    ours = {name: value for name, value, _ in metrics.detailed(cluster.nodes)}
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, abs=1e-8), name
    assert cluster.score() == pytest.approx(their_score, abs=1e-8)


def test_a_generated_cluster_scores_the_same_in_hinfo(tmp_path):
    path = tmp_path / "gen.txt"
    path.write_text(text_backend.serialize(unbalanced_cluster(12, 70, seed=9)))
    cluster = text_backend.parse(path.read_text(), ignore_dynu=True)
    assert cluster.score() == pytest.approx(hinfo_terms(path)[1], abs=1e-8)


def test_units_and_simulated_clusters_follow_htools():
    assert parse_unit("1024") == 1024
    assert parse_unit("1g") == 1024 and parse_unit("1t") == 1024 * 1024
    assert parse_unit("1G") == 953  # SI: 1000³ bytes in MiB, truncated
    c = simulated_cluster(["p,2,1t,64g,8", "a,1,100,1024,4,2"])
    assert [g.name for g in c.groups] == ["group-01", "group-02"]
    assert c.groups[0].alloc_policy == "last_resort"  # the last spec is group-01
    assert [n.name for n in c.nodes] == ["node-01-001", "node-02-001", "node-02-002"]
    assert c.nodes[0].is_master and c.nodes[0].n_cpu == 1 and c.nodes[0].t_spindles == 2


def test_scoring_with_replaced_nodes_equals_a_full_recomputation_bit_for_bit():
    # hspace/hail's exact mode scores candidates from cached per-node values; ties between
    # candidates break on the last bit, so the shortcut must not change a single one.
    cluster = unbalanced_cluster(9, 60, seed=4)
    rows = metrics.ValueRows(cluster.nodes)
    assert rows.score_with() == metrics.score(cluster.nodes)
    for inst in cluster.instances[:25]:
        target = cluster.nodes[(inst.pnode + 3) % len(cluster.nodes)]
        try:
            new = target.add_pri(inst.copy(), force=True)
        except AllocFailure:
            continue
        nodes = list(cluster.nodes)
        nodes[target.idx] = new
        assert rows.score_with(new) == metrics.score(nodes)


def test_instance_copies_carry_every_field():
    inst = unbalanced_cluster(3, 4, seed=1).instances[0]
    clone = inst.copy()
    assert all(getattr(clone, f) == getattr(inst, f) for f in type(inst).__slots__)
    assert clone is not inst


def _hexes(values):
    return [float(x).hex() for x in values]


def _stats_hexes(stats):
    return [_hexes(st) for st in stats]


def _filled(cluster, count, seed):
    """``cluster`` with ``count`` plain instances added as primaries, spread unevenly."""
    import random

    from placement.ganeti.instance import Instance

    rng = random.Random(seed)
    nodes = list(cluster.nodes)
    for k in range(count):
        inst = Instance(
            f"i{k}",
            rng.choice([16384, 4096]),
            rng.choice([102400, 20480]),
            rng.choice([1, 2, 8]),
            "running",
            True,
            -1,
            -1,
            "plain",
            [],
            1,
            None,
            idx=k,
        )
        i = rng.randrange(len(nodes))
        try:
            nodes[i] = nodes[i].add_pri(inst, force=True)
        except AllocFailure:
            continue
    return nodes


def _candidate_classes(nodes, inst):
    """Per class of candidates (the same values before and after adding ``inst``): the
    replaced nodes, as `allocation._single_solution` groups them."""
    classes = {}
    for node in nodes:
        try:
            new = node.add_pri(inst, force=True)
        except AllocFailure:
            continue
        key = (node.offline, metrics.node_values(node), metrics.node_values(new))
        classes.setdefault(key, []).append(new)
    return classes


@pytest.mark.parametrize("small_class", [2, 10**9], ids=["running-sums", "rebuilt-columns"])
def test_class_scores_equal_one_by_one_bit_for_bit(monkeypatch, small_class):
    # hspace re-scores the near ties of identical nodes per class, with the loops over the
    # candidates in C (running sums up to each one, the squared deviations once per mean),
    # or, for a few candidates, each one's column rebuilt: both held to the plain score.
    from placement.ganeti.instance import Instance

    monkeypatch.setattr(metrics, "SMALL_CLASS", small_class)

    inst = Instance("new", 16384, 102400, 8, "running", True, -1, -1, "plain", [], 1, None)
    several_means = checked = 0
    simulated = [_filled(simulated_cluster(["p,20,2000000,131072,32"]), n, s) for n, s in ((10, 1), (20, 0))]
    for nodes in (
        *simulated,
        _filled(simulated_cluster(["p,12,1000000,65536,16"]), 10, seed=4),
        list(unbalanced_cluster(9, 60, seed=4, template="plain").nodes),
    ):
        rows = metrics.ValueRows(nodes)
        for (off, old, new), replaced in _candidate_classes(nodes, inst).items():
            positions = [rows.position[n.idx] for n in replaced]
            bulk = rows.score_class(positions, off, old, new)
            assert _hexes(bulk) == _hexes(rows.score_with(n) for n in replaced)
            checked += len(replaced)
            # Term by term, against the column rebuilt for each candidate: a changed
            # column's sums, so its means, can differ in their last bits with the slot.
            slots = [rows.slot[p] for p in positions]
            for c in range(metrics.NCOMP):
                if old[c] == new[c] or metrics.ONLINE[c] == off:
                    continue
                expected = []
                for k in slots:
                    column = rows.columns[c][:k] + [new[c]] + rows.columns[c][k + 1 :]
                    expected.append(
                        metrics._term(
                            c,
                            metrics._std_stat(column) if metrics.KINDS[c] == metrics.STD else metrics._sum_stat(column),
                        )
                    )
                assert _hexes(rows.column_terms(c, slots, new[c])) == _hexes(expected)
                assert _hexes(rows._rebuilt_terms(c, slots, new[c])) == _hexes(expected)
                if metrics.KINDS[c] == metrics.STD:
                    several_means += (
                        len({sum(rows.columns[c][:k] + [new[c]] + rows.columns[c][k + 1 :], 0.0) for k in slots}) > 1
                    )
    assert checked > 30 and several_means  # classes, and the several-means branch


def test_derived_score_tables_equal_fresh_ones_bit_for_bit():
    # hspace's next state differs from the last in one node: its tables are derived.
    from placement.ganeti.instance import Instance

    inst = Instance("new", 2048, 20480, 2, "running", True, -1, -1, "plain", [], 1, None, idx=999)
    for nodes in (
        _filled(simulated_cluster(["p,12,2000000,131072,32"]), 20, seed=3),
        list(unbalanced_cluster(9, 60, seed=5, template="plain").nodes),
    ):
        rows = metrics.ValueRows(nodes)
        for pos in range(len(nodes)):
            changed = list(nodes)
            try:
                changed[pos] = nodes[pos].add_pri(inst, force=True)
            except AllocFailure:
                continue
            derived, fresh = rows.derive(changed, [pos]), metrics.ValueRows(changed)
            assert _stats_hexes(derived.base) == _stats_hexes(fresh.base)
            assert _hexes(derived.terms) == _hexes(fresh.terms)
            assert derived.columns == fresh.columns and derived.twin == fresh.twin
            # The N+1 check's running statistics, updated in place, agree too.
            column = metrics.ColumnStats(nodes)
            column.set(pos, changed[pos])
            assert _stats_hexes(column.stats) == _stats_hexes(metrics.ColumnStats(changed).stats)
            assert _hexes(column.terms) == _hexes(fresh.terms)
    # Simulated nodes have twin columns (the loads, the "_forth" values): shared, not recomputed.
    assert fresh.twin != list(range(metrics.NCOMP)) or rows.twin != list(range(metrics.NCOMP))


def test_tables_derived_one_placement_after_another_equal_fresh_ones():
    # hspace derives each state's tables from the last one's, placement after placement:
    # the twin columns re-matched where a column changed must stay `_share_twins`' own.
    from placement.ganeti.instance import Instance

    sizes = [(2048, 20480, 2), (1024, 10240, 1), (4096, 40960, 4)]
    for nodes in (
        list(simulated_cluster(["p,6,2000000,131072,32"]).nodes),
        list(unbalanced_cluster(7, 40, seed=11, template="plain").nodes),
    ):
        rows = metrics.ValueRows(nodes)
        derived_steps = 0
        for step in range(40):
            mem, dsk, cpu = sizes[step % len(sizes)]
            inst = Instance("new", mem, dsk, cpu, "running", True, -1, -1, "plain", [], 1, None, idx=999)
            pos = (step * 5) % len(nodes)
            try:
                nodes = nodes[:pos] + [nodes[pos].add_pri(inst, force=True)] + nodes[pos + 1 :]
            except AllocFailure:
                continue
            derived, fresh = rows.derive(nodes, [pos]), metrics.ValueRows(nodes)
            assert derived.twin == fresh.twin and derived.columns == fresh.columns
            assert _stats_hexes(derived.base) == _stats_hexes(fresh.base)
            assert _hexes(derived.terms) == _hexes(fresh.terms)
            rows = derived
            derived_steps += 1
        assert derived_steps > 20


def test_kept_outcomes_are_what_the_add_gives():
    # Allocation keeps each node's outcome of an add per instance shape on the node.
    from placement.ganeti.fast_moves import primary_outcome
    from placement.ganeti.instance import shape

    cluster = unbalanced_cluster(8, 50, seed=6, template="plain")
    for inst in cluster.instances[:20]:
        probe = inst.copy()
        probe.idx = len(cluster.instances)
        for node in cluster.nodes:
            try:
                expected = metrics.node_values(node.add_pri(probe))
            except AllocFailure as exc:
                expected = exc.mode
            key = (False, *shape(probe))
            assert primary_outcome(node, probe, False, key) == expected
            assert primary_outcome(node, probe, False, key) is node.outcomes[key]  # kept
            assert node.copy().outcomes is None  # a changed node starts afresh


def test_twin_statistics_updated_once_equal_their_own_update_bit_for_bit():
    # Twin columns share one statistics object; a node moving both alike updates it once
    # (`ClusterStats.twin`): the same bits as updating each, and the pair scores on top.
    from placement.ganeti.instance import Instance

    inst = Instance("new", 2048, 20480, 2, "running", True, -1, -1, "drbd", [], 1, None, idx=999)
    shared = 0
    for nodes in (
        _filled(simulated_cluster(["p,6,2000000,131072,32"]), 12, seed=4),
        list(unbalanced_cluster(7, 50, seed=6).nodes),
    ):
        rows = metrics.ValueRows(nodes)
        with_twins = rows.cluster_stats()
        alone = metrics.ClusterStats(rows.base)  # no twins known: every component updated
        alone.terms = list(rows.terms)
        for p, s in ((p, s) for p in range(len(nodes)) for s in range(len(nodes)) if p != s):
            try:
                new_p, new_s = nodes[p].add_pri(inst), nodes[s].add_sec(inst, p)
            except AllocFailure:
                continue
            primary = (False, metrics.node_values(nodes[p]), metrics.node_values(new_p))
            a, b = with_twins.replace_values(*primary), alone.replace_values(*primary)
            assert _stats_hexes(a.stats) == _stats_hexes(b.stats) and _hexes(a.terms) == _hexes(b.terms)
            shared += sum(a.stats[c] is a.stats[d] for c in range(metrics.NCOMP) for d in range(c))
            secondary = (False, metrics.node_values(nodes[s]), metrics.node_values(new_s))
            assert a.score_replaced_values(*secondary).hex() == b.score_replaced_values(*secondary).hex()
    assert shared > 0  # twins moved alike, and their update was shared


def test_value_changes_kept_per_pair_of_tuples_are_the_plain_computation():
    # `metrics.value_changes` is kept under the ids of the two value tuples (held, so the
    # ids stay theirs): asked again, and for tuples made later, it gives the changes and
    # the update's parts as Ganeti's update computes them.
    rng = random.Random(7)

    def plain(off, old, new):
        out = []
        for c in range(metrics.NCOMP):
            if old[c] != new[c] and metrics.ONLINE[c] != off:
                x, x2 = old[c], new[c]
                if metrics.KINDS[c] == metrics.SUM:
                    out.append((c, x, x2, None, None, None))
                else:
                    out.append((c, x, x2, x2 - x, x2 * x2 - x * x, (x2 - x) * (x2 - x)))
        return tuple(out)

    for _ in range(300):
        old = tuple(rng.choice([0.0, 0.25, 1.0, rng.random()]) for _ in range(metrics.NCOMP))
        new = tuple(v if rng.random() < 0.5 else rng.random() for v in old)
        off = rng.random() < 0.2
        assert metrics.value_changes(off, old, new) == plain(off, old, new)
        assert metrics.value_changes(off, old, new) == plain(off, old, new)  # kept
        del old, new  # their addresses may serve the next tuples
