"""Invariants checked on generated clusters against brute-force references."""

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement import (
    Allocation,
    Cluster,
    Host,
    NodeGroup,
    PlacementEngine,
    PlacementOptions,
    Request,
    Resources,
)
from placement import search as search_module

from . import helpers

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def allocations(draw, prefix, horizon=40):
    out = []
    for i in range(draw(st.integers(0, 5))):
        start = draw(st.integers(0, horizon))
        end = draw(st.one_of(st.none(), st.integers(start + 1, horizon + 10)))
        out.append(
            Allocation(
                f"{prefix}-{i}",
                Resources(draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(0, 3))),
                start,
                end,
                draw(st.sampled_from([None, None, "aa"])),
            )
        )
    return tuple(out)


def _within_capacity(host: Host) -> Host:
    """Keep the allocations that fit: the starting point must not be overcommitted."""
    kept: list[Allocation] = []
    for a in host.allocations:
        trial = dataclasses.replace(host, allocations=(*kept, a))
        if helpers.never_overcommitted(Cluster((trial,))):
            kept.append(a)
    return dataclasses.replace(host, allocations=tuple(kept))


@st.composite
def clusters(draw):
    hosts = []
    for i in range(draw(st.integers(1, 5))):
        hosts.append(
            Host(
                f"h{i}",
                Resources(draw(st.integers(2, 8)), draw(st.integers(2, 8)), draw(st.integers(1, 6))),
                reserved=Resources(draw(st.integers(0, 1)), 0, 0),
                overcommit={"vcpus": draw(st.sampled_from([1.0, 1.5, 2.0]))},
                state=draw(st.sampled_from(["online", "online", "online", "drained", "offline"])),
                group=draw(st.sampled_from(["g1", "g1", "g2"])),
                hypervisor=draw(st.sampled_from(["kvm", "kvm", "esx"])),
                max_vms=draw(st.sampled_from([None, None, 3])),
                allocations=draw(allocations(f"h{i}")),
            )
        )
    hosts = [_within_capacity(h) for h in hosts]
    groups = (
        NodeGroup("g1", policy=draw(st.sampled_from(["balanced", "pack"]))),
        NodeGroup(
            "g2",
            alloc_policy=draw(st.sampled_from(["preferred", "last_resort", "unallocatable"])),
            policy=draw(st.sampled_from(["balanced", "pack"])),
        ),
    )
    return Cluster(tuple(hosts), groups, now=draw(st.integers(0, 20)))


@st.composite
def requests(draw, rid="r"):
    start = draw(st.integers(0, 40))
    end = draw(st.one_of(st.none(), st.integers(start + 1, start + 20)))
    return Request(
        Resources(draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(0, 3))),
        start,
        end,
        rid,
        hypervisors=draw(st.sampled_from([None, frozenset({"kvm"})])),
        anti_affinity=draw(st.sampled_from([None, "aa"])),
    )


@SETTINGS
@given(clusters(), st.lists(requests(), min_size=1, max_size=8))
def test_it_never_overcommits_any_resource_at_any_instant(cluster, reqs):
    engine = PlacementEngine(cluster)
    for i, r in enumerate(reqs):
        result = engine.place(dataclasses.replace(r, id=f"q{i}"))
        if result.ok:
            engine.commit(result)
    assert helpers.never_overcommitted(engine.snapshot())


@SETTINGS
@given(clusters(), st.lists(requests(), min_size=1, max_size=6))
def test_drained_and_offline_hosts_never_receive(cluster, reqs):
    closed = {h.name for h in cluster.hosts if str(h.state) != "online"}
    engine = PlacementEngine(cluster)
    for i, r in enumerate(reqs):
        result = engine.place(dataclasses.replace(r, id=f"q{i}"))
        assert result.host not in closed
        if result.ok:
            engine.commit(result)


@SETTINGS
@given(clusters(), requests())
def test_add_then_remove_restores_the_host(cluster, r):
    engine = PlacementEngine(cluster)
    state = engine.state
    before_sums = (list(state.sum_u), list(state.sum_u2))
    before_peaks = [s.timeline.peak(0, math.inf) for s in state.slots]
    target = cluster.hosts[0].name
    engine.add_allocation(target, r.as_allocation())
    engine.remove_allocation(r.id)
    assert engine.snapshot() == cluster
    assert [s.timeline.peak(0, math.inf) for s in state.slots] == before_peaks
    for a, b in zip(before_sums[0] + before_sums[1], state.sum_u + state.sum_u2, strict=True):
        assert math.isclose(a, b, abs_tol=1e-9)


@SETTINGS
@given(clusters(), requests(), st.integers(0, 30), st.one_of(st.none(), st.integers(1, 15)))
def test_earliest_fit_equals_a_brute_force_search(cluster, r, not_before, duration):
    fit = PlacementEngine(cluster).earliest_fit(r, duration, not_before)
    horizon = 80  # beyond every allocation end in these clusters
    assert fit.start == helpers.brute_earliest(cluster, r, duration, not_before, horizon)


def _check_choice(cluster, r):
    result = PlacementEngine(cluster).place(r)
    tiers = _tiers(cluster)
    feasible = {h.name for h in helpers.feasible_hosts(cluster, r)}
    if not feasible:
        assert not result.ok
        return
    assert result.ok, result
    # the deciding tier: preferred groups if any of their hosts fits
    first = [name for name in tiers[0] if name in feasible] or [name for name in tiers[1] if name in feasible]
    assert result.host in first
    policy = r.policy or cluster.group(next(h.group for h in cluster.hosts if h.name == result.host)).policy
    scores = (helpers.pack_scores if str(policy) == "pack" else helpers.balanced_scores)(cluster, r)
    in_tier = {h: s for h, s in scores.items() if h in first and _policy_of(cluster, h, r) == policy}
    assert math.isclose(scores[result.host], min(in_tier.values()), rel_tol=1e-9, abs_tol=1e-9)


def _policy_of(cluster, name, r):
    h = next(h for h in cluster.hosts if h.name == name)
    return r.policy or cluster.group(h.group).policy


def _tiers(cluster):
    pref, last = [], []
    for h in cluster.hosts:
        policy = str(cluster.group(h.group).alloc_policy)
        (last if policy == "last_resort" else pref).append(h.name)
    return pref, last


@SETTINGS
@given(clusters(), requests())
def test_the_chosen_host_has_the_best_score_of_its_tier(cluster, r):
    if len({str(g.policy) for g in cluster.groups}) > 1 and r.policy is None:
        r = dataclasses.replace(r, policy="balanced")
    _check_choice(cluster, r)


@settings(max_examples=25, deadline=None)
@given(clusters(), requests(), st.sampled_from(["balanced", "pack"]))
def test_the_pruned_search_agrees_with_scoring_every_host(cluster, r, policy):
    # Force the pruned walk even on tiny clusters by lowering the direct-scoring limit.
    saved = search_module.DIRECT_LIMIT
    search_module.DIRECT_LIMIT = 0
    try:
        _check_choice(cluster, dataclasses.replace(r, policy=policy))
    finally:
        search_module.DIRECT_LIMIT = saved


def test_options_are_an_explicit_record():
    options = PlacementOptions(closest_misses=1, earliest_fit=False)
    c = Cluster((Host("h", Resources(1, 1, 1)),))
    result = PlacementEngine(c, options).place(Request(Resources(2, 1, 1)))
    assert result.earliest_fit is None and len(result.closest_misses) == 1
