"""The global N+1 check's shortcuts give the answers of the work they skip: counting
instances as if each were the largest, or alike ones (the re-creations), refuting a
candidate (building it and checking), hspace's unscored search and its refusals of a
shape that fits nowhere (`try_alloc`)."""

import random
from collections import Counter
from pathlib import Path

from placement.ganeti import hspace, n_plus_one, text_backend
from placement.ganeti import types as T
from placement.ganeti.allocation import AllocOptions, any_fit, refusals, try_alloc
from placement.ganeti.cluster import GCluster
from placement.ganeti.hspace import HSpaceOptions, Spec, run_hspace
from placement.ganeti.instance import Instance
from placement.ganeti.node import Node
from placement.ganeti.simulate import simulated_cluster

from .varied import _fill_free, varied_cluster

DATA = Path(__file__).parents[2] / "data" / "placement" / "ganeti"

RUNS = [
    ("mixed-states.txt", "plain", "10240,1024,1", "102400,8192,4"),
    ("two-minmax-specs.txt", "file", None, None),
    ("two-minmax-specs.txt", "plain", "20480,512,1", None),
    ("forthcoming.txt", "plain", "10240,1024,1", "102400,8192,4"),
    (["p,3,400000,32768,16"], "plain", "10240,2048,1", "51200,8192,4"),
]


def _states(monkeypatch, source, template, standard, tiered) -> list:
    """Every cluster state hspace asks the N+1 check about on this run (at most 300)."""
    if isinstance(source, list):
        cluster = simulated_cluster(source)
    else:
        cluster = text_backend.parse((DATA / source).read_text())
    seen = []
    plain = n_plus_one._redundant

    def record(state, scope, accept_existing):
        if len(seen) < 300:
            seen.append(state)
        return plain(state, scope, accept_existing)

    monkeypatch.setattr(n_plus_one, "_redundant", record)
    opts = HSpaceOptions(
        disk_template=template,
        standard=Spec.parse(standard) if standard else None,
        tiered=Spec.parse(tiered) if tiered else None,
    )
    run_hspace(cluster, opts)
    monkeypatch.setattr(n_plus_one, "_redundant", plain)
    return seen


def _spy_on_counting(monkeypatch) -> Counter:
    """Counts the answers of `_take_by_count` ("alike") and `_hold_as_largest` ("largest")."""
    taken = Counter()
    for name, label in (("_take_by_count", "alike"), ("_hold_as_largest", "largest")):
        plain = getattr(n_plus_one, name)

        def spy(*args, plain=plain, label=label):
            answer = plain(*args)
            taken[label, answer] += 1
            return answer

        monkeypatch.setattr(n_plus_one, name, spy)
    return taken


def _answers(states, shortcut: bool) -> list[bool]:
    n_plus_one._COUNT_SHORTCUT[0] = shortcut
    try:
        return [n_plus_one.can_evacuate_node(s, n.idx) for s in states for n in s.nodes]
    finally:
        n_plus_one._COUNT_SHORTCUT[0] = True


def test_counting_alike_instances_answers_as_re_creating_them(monkeypatch):
    taken = _spy_on_counting(monkeypatch)
    for run in RUNS:
        states = _states(monkeypatch, *run)
        states += [varied_cluster(seed, nodes=5, instances=30) for seed in range(1, 6)]
        assert _answers(states, True) == _answers(states, False), run
    # Each answer came from counting, many times.
    assert taken["largest", True] > 50 and taken["alike", False] > 10, taken


def _alike_cluster(seed: int) -> GCluster:
    """Nodes near full of instances of one size (some stopped, some forthcoming, a few
    larger ones), offline nodes and memory overhead among them: evacuations whose tails
    are alike, ending on both sides of the count."""
    rng = random.Random(seed)
    nodes = []
    for i in range(rng.choice([3, 4, 5])):
        mem = rng.choice([8192, 12288, 16384]) + rng.choice([0, 700, 1500])  # not in whole instances
        dsk = rng.choice([40960, 81920])
        nodes.append(Node(f"node{i}", mem, rng.choice([0, 1024]), mem, dsk, 0, 8, 1, offline=rng.random() < 0.2))
    template = rng.choice(["plain", "plain", "file", "diskless"])
    bulk_mem, bulk_dsk = rng.choice([1024, 2048]), rng.choice([5120, 10240])
    instances = []
    for k in range(rng.randrange(10, 40)):
        mem, dsk = (4096, 20480) if rng.random() < 0.15 else (bulk_mem, bulk_dsk)
        dsk = 0 if template == "diskless" else dsk
        state = "running" if rng.random() < 0.85 else "ADMIN_down"
        disks = [] if template == "diskless" else [(dsk, 1)]
        instances.append(
            Instance(
                f"i{k}",
                mem,
                dsk,
                1,
                state,
                True,
                rng.randrange(len(nodes)),
                -1,
                template,
                [],
                1,
                disks,
                forthcoming=rng.random() < 0.1,
            )
        )
    _fill_free(nodes, instances, rng)
    cluster = GCluster.build([T.Group("default", "uuid-default", "preferred")], nodes, instances, name="alike")
    return text_backend.parse(text_backend.serialize(cluster))


def test_counting_holds_on_alike_instances_near_full_nodes(monkeypatch):
    taken = _spy_on_counting(monkeypatch)
    for seed in range(60):
        cluster = _alike_cluster(seed)
        states = [cluster]
        # The same cluster with one more bulk instance on each node that takes it.
        probe = cluster.instances[-1].copy()
        probe.idx, probe.forthcoming = len(cluster.instances), False
        for node in cluster.nodes:
            state = _added(cluster, node, probe, force=True)
            if state is not None:
                states.append(state)
        assert _answers(states, True) == _answers(states, False), seed
    assert taken["largest", True] > 20 and taken["alike", False] > 20, taken


def _added(cluster, node, inst, force: bool = False):
    """``cluster`` with ``inst`` added as a primary on ``node``; None when the add fails."""
    try:
        new = node.add_pri(inst, force=force)
    except T.AllocFailure:
        return None
    nodes = list(cluster.nodes)
    nodes[node.idx] = new
    placed = inst.copy()
    placed.pnode = node.idx
    return cluster.replaced(nodes, [*cluster.instances, placed])


def _search_states(monkeypatch) -> list:
    """The states hspace's big-step search asks about (`_Allocator.alloc_fn`'s clusters)
    on the runs above, and some generated ones."""
    states = []
    plain = hspace._Allocator.alloc_fn

    def record(self, cluster):
        states.append(cluster)
        return plain(self, cluster)

    monkeypatch.setattr(hspace._Allocator, "alloc_fn", record)
    for run in RUNS:
        _states(monkeypatch, *run)
    monkeypatch.setattr(hspace._Allocator, "alloc_fn", plain)
    return states + [_alike_cluster(seed) for seed in range(20)]


def _shapes(cluster, template: str) -> list[Instance]:
    """Shrinking new instances, as the search tries them."""
    out = []
    for mem, dsk, cpu in ((8192, 102400, 4), (4096, 10240, 2), (2048, 5120, 1), (64, 1024, 1)):
        inst = Instance("new", mem, dsk, cpu, "running", True, -1, -1, template, [], 1, [(dsk, 1)])
        inst.idx = len(cluster.instances)
        out.append(inst)
    return out


def test_refuted_candidates_fail_the_full_check(monkeypatch):
    refuted = Counter()
    for state in _search_states(monkeypatch):
        refuter = n_plus_one.Refuter(state)
        for victim in state.nodes:
            n_plus_one._LAST_FAILED[0] = victim.name
            for template in ("plain", "file"):
                for inst in _shapes(state, template):
                    for node in state.nodes:
                        if not refuter(node.idx, inst):
                            continue
                        candidate = _added(state, node, inst)
                        if candidate is None:
                            continue
                        assert not n_plus_one.redundant(candidate, remember=False)
                        refuted[template] += 1
    assert refuted["plain"] > 100 and refuted["file"] > 100, refuted


def test_the_unscored_search_answers_as_try_alloc(monkeypatch):
    # Whether something fits, and the failures when nothing does: all the search reads.
    fits = Counter()
    for state in _search_states(monkeypatch):
        alloc_nodes = [n.idx for n in state.nodes if not n.offline]
        n1 = lambda cl: n_plus_one.redundant(cl, remember=False)  # noqa: E731
        for template in ("plain", "file"):
            for inst in _shapes(state, template):
                opts = AllocOptions(capacity=True)
                full = try_alloc(opts, state, inst, alloc_nodes, n1, two_nodes=False)
                quick = any_fit(opts, state, inst, alloc_nodes, n1, n_plus_one.Refuter(state))
                assert (quick.solution is None) == (full.solution is None)
                if full.solution is None:
                    assert quick.failures == full.failures
                fits[full.solution is not None] += 1
    assert fits[True] > 20 and fits[False] > 50, fits


def test_a_shape_refused_everywhere_is_refused_as_try_alloc_refuses_it(monkeypatch):
    # hspace's `iterate` returns such a refusal without trying to place the shape.
    refused = Counter()
    for state in _search_states(monkeypatch):
        alloc_nodes = [n.idx for n in state.nodes if not n.offline]
        for template in ("plain", "file"):
            for inst in _shapes(state, template):
                for mem in (inst.mem, 40000, 70000):
                    probe = inst.copy()
                    probe.mem = mem
                    opts = AllocOptions(capacity=False)
                    full = try_alloc(opts, state, probe, alloc_nodes, two_nodes=False)
                    quick = refusals(opts, state, probe, alloc_nodes)
                    assert (quick is None) == (full.solution is not None)
                    if quick is not None:
                        assert quick == full.failures
                    refused[quick is not None] += 1
    assert refused[True] > 50 and refused[False] > 50, refused


def test_failovers_on_scalar_records_answer_as_the_moves_built_whole(monkeypatch):
    # A node of DRBD primaries only is evacuated by failing each over: replayed on scalar
    # records (`_fail_over_all`), the answer is `apply_move`'s, node for node.
    states = []
    for run in (
        (["p,3,34052480,65523,24"], "drbd", None, "1048576,1024,8"),
        (["p,4,400000,32768,16"], "drbd", "10240,2048,1", "51200,8192,4"),
    ):
        states += _states(monkeypatch, *run)
    for seed in range(1, 9):
        states.append(varied_cluster(seed))
    answers = Counter()
    for state in states:
        for node in state.nodes:
            if not node.plist or any(state.instances[i].disk_template != "drbd" for i in node.plist):
                continue
            got = []
            for scratch in (True, False):
                monkeypatch.setattr(n_plus_one, "_SCRATCH_FAILOVERS", [scratch])
                got.append(n_plus_one.can_evacuate_node(state, node.idx))
            assert got[0] == got[1]
            answers[got[0]] += 1
    assert answers[True] > 20 and answers[False] > 5, answers
