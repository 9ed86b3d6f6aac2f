"""The balanced search's per-window sums, kept incrementally, against every host's timeline."""

import math
import random

from placement import Allocation, Cluster, Host, PlacementEngine, PlacementOptions, Resources
from placement.search import Window, window_sums


def random_cluster(rng, hosts=60):
    out = []
    for i in range(hosts):
        allocations = []
        for j in range(rng.randint(0, 8)):
            start = rng.uniform(-50, 500)
            end = None if rng.random() < 0.15 else start + rng.uniform(1, 80)
            need = Resources(rng.randint(0, 3), rng.randint(0, 4) * 512, rng.randint(0, 20))
            allocations.append(Allocation(f"a{i}-{j}", need, start, end))
        state = rng.choice(["online"] * 8 + ["drained", "offline"])
        out.append(Host(f"h{i}", Resources(32, 65536, 500), state=state, allocations=tuple(allocations)))
    return Cluster(tuple(out), now=0.0)


def reference_sums(state, start, end):
    n, s, q = 0, [0.0] * len(state.scored), [0.0] * len(state.scored)
    for slot in state.slots:
        if slot.online:
            n += 1
            for k, u in enumerate(state.utilisation(slot, slot.timeline.peak(start, end))):
                s[k] += u
                q[k] += u * u
    return n, s, q


def check_windows(state, rng, count=150):
    need = state.space.vector(Resources(1, 512, 5), vms=1)
    for _ in range(count):
        start = rng.uniform(0, 550)
        end = math.inf if rng.random() < 0.1 else start + rng.uniform(0.5, 120)
        window = Window(start, end, need, state.window_entries(start, end), set())
        n, s, q = window_sums(state, window)
        rn, rs, rq = reference_sums(state, start, end)
        assert n == rn
        for got, want in zip(s + q, rs + rq, strict=True):
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
        assert window.touched == state.touched_hosts(start, end)
        for idx in window.touched:  # the peaks the search will score hosts with
            peak = window.peak(state, state.slots[idx])
            want = state.slots[idx].timeline.peak(start, end)
            assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(peak, want, strict=True))


def test_window_sums_equal_the_sums_over_every_hosts_exact_peak():
    rng = random.Random(4)
    engine = PlacementEngine(random_cluster(rng), PlacementOptions(bucket_seconds=20))
    check_windows(engine.state, rng)


def test_window_sums_follow_added_and_removed_allocations_and_baselines():
    rng = random.Random(5)
    engine = PlacementEngine(random_cluster(rng), PlacementOptions(bucket_seconds=20))
    names = [h.name for h in engine.state.cluster.hosts]
    ids = list(engine.state.allocation)
    for i in range(150):
        start = rng.uniform(-20, 500)
        # Some open-ended ones that started already: they change the host's baseline.
        end = None if rng.random() < 0.2 else start + rng.uniform(1, 60)
        alloc = Allocation(f"n{i}", Resources(rng.randint(0, 2), 512, rng.randint(0, 5)), start, end)
        engine.add_allocation(rng.choice(names), alloc)
        ids.append(alloc.id)
    for alloc_id in rng.sample(ids, len(ids) // 3):
        engine.remove_allocation(alloc_id)
    check_windows(engine.state, rng)
