"""Suspend instead of preempt, in the pure core: the fewest lower-class claims whose
suspension (CPU and memory back, disk kept) lets a request fit, or None."""

from hypothesis import given, settings
from hypothesis import strategies as st

from placement import Allocation, Cluster, Host, HostState, PlacementEngine, Request, Resources
from placement.preempt import Preemptible, disk_only, nothing, plan

R = Resources
LOW, BATCH, HIGH = 1, 2, 3


def host(name, allocations, memory=4096, disk=100, state=HostState.ONLINE):
    return Host(name, R(8, memory, disk), state=state, allocations=tuple(allocations))


def claim(name, memory=1024, disk=10):
    return Allocation(name, R(1, memory, disk), start=0)


def run(name, rank=BATCH, label=None):
    return Preemptible(name, rank, label or {LOW: "low run", BATCH: "batch run", HIGH: "high run"}[rank])


def ask(memory=2048, disk=0):
    return Request(R(1, memory, disk), start=0, end=3600)


def test_it_names_the_fewest_runs_that_make_room():
    full = host("h1", [claim("a"), claim("b"), claim("c"), claim("d")])  # 4096 of 4096 MiB used
    found = plan(Cluster((full,)), ask(2048), HIGH, [run("a"), run("b"), run("c"), run("d")])
    assert found.host == "h1" and len(found.victims) == 2
    assert found.note() == "fits if 2 batch runs are suspended"


def test_lower_classes_go_first_and_the_biggest_of_them():
    full = host("h1", [claim("small-low", 512), claim("big-low", 1536), claim("batch", 2048)])
    candidates = [run("small-low", LOW), run("big-low", LOW), run("batch", BATCH)]
    found = plan(Cluster((full,)), ask(1536), HIGH, candidates)
    assert [v.allocation for v in found.victims] == ["big-low"]
    assert found.note() == "fits if 1 low run is suspended"


def test_mixed_classes_are_counted_per_class_and_unneeded_ones_dropped():
    full = host("h1", [claim("low", 1024), claim("batch", 2048), claim("other", 1024)])
    found = plan(Cluster((full,)), ask(3072), HIGH, [run("low", LOW), run("batch", BATCH)])
    assert found.note() == "fits if 1 low run and 1 batch run are suspended"


def test_it_never_suspends_an_equal_or_higher_class_nor_an_unlisted_claim():
    full = host("h1", [claim("reservation", 2048), claim("high", 2048)])
    assert plan(Cluster((full,)), ask(1024), HIGH, [run("high", HIGH)]) is None
    assert plan(Cluster((full,)), ask(1024), BATCH, [run("high", BATCH)]) is None  # equal: no


def test_the_host_needing_fewest_suspensions_wins():
    two = host("h1", [claim("a", 2048), claim("b", 2048)])
    one = host("h2", [claim("c", 3072), claim("d", 1024)])
    found = plan(Cluster((two, one)), ask(3072), HIGH, [run("a"), run("b"), run("c"), run("d")])
    assert found.host == "h2" and [v.allocation for v in found.victims] == ["c"]


def test_suspended_claims_keep_their_disk_so_a_host_short_of_disk_is_not_helped():
    full = host("h1", [claim("a", 2048, disk=50), claim("b", 2048, disk=50)], disk=100)
    assert plan(Cluster((full,)), ask(1024, disk=10), HIGH, [run("a"), run("b")]) is None
    assert disk_only(claim("a", 2048, disk=50)).resources == R(0, 0, 50)


def test_a_drained_host_is_never_a_target():
    drained = host("h1", [claim("a", 4096)], state=HostState.DRAINED)
    assert plan(Cluster((drained,)), ask(1024), HIGH, [run("a")]) is None


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=256, max_value=2048), min_size=1, max_size=6),
    ranks=st.lists(st.sampled_from([LOW, BATCH, HIGH]), min_size=6, max_size=6),
    wanted=st.integers(min_value=256, max_value=4096),
)
def test_what_it_names_is_enough_and_never_overcommits(sizes, ranks, wanted):
    claims = [claim(f"c{i}", size) for i, size in enumerate(sizes)]
    used = sum(sizes)
    if used > 8192:
        return
    h = host("h1", claims, memory=8192)
    candidates = [run(c.id, rank) for c, rank in zip(claims, ranks, strict=False)]
    found = plan(Cluster((h,)), ask(wanted), HIGH, candidates)
    if found is None:
        return
    assert all(v.rank < HIGH for v in found.victims)
    names = {v.allocation for v in found.victims}
    after = host("h1", [disk_only(c) if c.id in names else c for c in claims], memory=8192)
    assert PlacementEngine(Cluster((after,))).place(ask(wanted)).ok  # it fits, without overcommitting
    freed = sum(c.resources.memory_mib for c in claims if c.id in names)
    assert 8192 - used + freed >= wanted


def test_a_claim_that_yields_gives_back_its_disk_too_where_a_suspended_one_keeps_it():
    full = host("h1", [claim("warm", 1024, disk=90)], disk=100)
    warm = [Preemptible("warm", 0, "warm VM")]
    assert plan(Cluster((full,)), ask(1024, disk=20), 1, warm) is None  # suspended, its disk stays
    found = plan(Cluster((full,)), ask(1024, disk=20), 1, warm, shrink=nothing)
    assert found.host == "h1" and found.what() == "1 warm VM"
