"""Policies, node-group tiers, results and multi-allocation."""

import calendar

from placement import (
    EarliestFit,
    PlacementEngine,
    PlacementResult,
    Request,
    earliest_fit,
    place,
    place_many,
)

from .helpers import R, alloc, cluster, group, host, request


def test_balanced_prefers_the_emptier_host():
    c = cluster(host("busy", allocations=(alloc("x", vcpus=8, mem=32768),)), host("idle"))
    assert place(c, request()).host == "idle"


def test_pack_prefers_the_fuller_host_and_keeps_empty_hosts_empty():
    c = cluster(
        host("busy", allocations=(alloc("x", vcpus=8, mem=32768),)),
        host("idle"),
        groups=[group("default", policy="pack")],
    )
    assert place(c, request()).host == "busy"
    assert place(c, request(policy="balanced")).host == "idle"


def test_pack_skips_the_fullest_host_when_it_cannot_fit():
    c = cluster(
        host("full", mem=8192, allocations=(alloc("x", mem=8000),)),
        host("half", mem=8192, allocations=(alloc("y", mem=4000),)),
        host("empty", mem=8192),
        groups=[group("default", policy="pack")],
    )
    assert place(c, request(mem=1024)).host == "half"


def test_last_resort_groups_only_when_no_preferred_host_fits():
    c = cluster(
        host("pref", group="main", mem=4096),
        host("spare", group="reserve", mem=65536),
        groups=[group("main"), group("reserve", "last_resort")],
    )
    assert place(c, request(mem=2048)).host == "pref"
    assert place(c, request(mem=8192)).host == "spare"


def test_policy_per_node_group():
    c = cluster(
        host("p1", group="packed", allocations=(alloc("x", mem=30000),)),
        host("p2", group="packed"),
        groups=[group("packed", policy="pack")],
    )
    assert place(c, request()).host == "p1"


def test_result_explains_a_refusal_in_one_line():
    jan1 = calendar.timegm((2026, 12, 1, 12, 0, 0))
    busy = alloc("x", mem=60000, start=jan1, end=jan1 + 9000)
    c = cluster(
        host("a", allocations=(busy,)),
        host("b", state="drained"),
        host("c", hypervisor="esx"),
        now=jan1,
    )
    result = place(c, request(mem=8192, start=jan1, end=jan1 + 3600, hypervisors=frozenset({"kvm"})))
    assert str(result) == ("no host: 1 drained, 1 wrong hypervisor type, 1 lack memory; earliest fit 2026-12-01 14:30")
    assert result.closest_misses[0].host == "a"
    assert result.closest_misses[0].shortfall.memory_mib == 60000 + 8192 - 65536
    data = result.to_dict()
    assert data["earliest_fit"]["host"] == "a"
    assert data["summary"] == str(result)


def test_a_success_prints_host_and_policy():
    result = place(cluster(host("h")), request())
    assert isinstance(result, PlacementResult) and result.ok
    assert str(result).startswith("host h (balanced")


def test_earliest_fit_waits_for_the_blocking_allocation_to_end():
    c = cluster(host("h", vcpus=4, allocations=(alloc("x", vcpus=4, start=0, end=500),)))
    fit = earliest_fit(c, request(vcpus=2), duration=100, not_before=0)
    assert fit == EarliestFit(500, "h")
    assert earliest_fit(c, request(vcpus=8), 100, 0).start is None


def test_earliest_fit_for_open_ended_requests():
    c = cluster(
        host(
            "h",
            vcpus=4,
            allocations=(
                alloc("x", vcpus=4, start=0, end=50),
                alloc("y", vcpus=4, start=200, end=300),
            ),
        )
    )
    assert earliest_fit(c, request(vcpus=1), duration=None, not_before=0).start == 300
    assert earliest_fit(c, request(vcpus=1), duration=100, not_before=0).start == 50


def test_earliest_fit_never_fits_when_open_ended_allocations_fill_the_host():
    c = cluster(host("h", vcpus=4, allocations=(alloc("x", vcpus=4, start=0),)))
    fit = earliest_fit(c, request(vcpus=1), 10, 0)
    assert fit.start is None and dict(fit.reasons) == {"not_free": 1}


def test_place_many_all_or_nothing_keeps_nothing_on_failure():
    c = cluster(host("h", vcpus=4))
    reqs = [request(vcpus=2, rid=f"r{i}") for i in range(3)]
    res = place_many(c, reqs, all_or_nothing=True)
    assert not res.ok and res.placed == ()
    assert [r.ok for r in res.results] == [True, True, False]
    partial = place_many(c, reqs)
    assert len(partial.placed) == 2


def test_place_many_sees_earlier_placements_and_can_commit():
    engine = PlacementEngine(cluster(host("a", vcpus=2), host("b", vcpus=2)))
    res = engine.place_many([request(vcpus=2, rid="x"), request(vcpus=2, rid="y")], commit=True)
    assert {r.host for r in res.results} == {"a", "b"}
    assert not engine.place(request(vcpus=1, rid="z")).ok


def test_commit_and_remove_round_trip():
    c = cluster(host("h"))
    engine = PlacementEngine(c)
    result = engine.place(Request(R(2, 2048, 20), 10, 20, "vm-1"))
    engine.commit(result)
    assert [a.id for a in engine.snapshot().hosts[0].allocations] == ["vm-1"]
    engine.remove_allocation("vm-1")
    assert engine.snapshot() == c


def test_windows_before_now_use_the_exact_slow_path():
    # An open-ended allocation started at 100 (baseline) must not block [0, 50).
    c = cluster(host("h", vcpus=2, allocations=(alloc("x", vcpus=2, start=100),)), now=100)
    assert place(c, request(vcpus=2, start=0, end=50)).ok
    assert not place(c, request(vcpus=2, start=100, end=150)).ok


def test_warming_an_engine_changes_no_decision():
    c = cluster(
        host("a", allocations=(alloc("x", vcpus=8, start=0, end=100),)),
        host("b", allocations=(alloc("y", mem=30000, start=50, end=200),)),
    )
    cold, warm = PlacementEngine(c), PlacementEngine(c)
    warm.warm()
    for start in (0, 60, 150, 300):
        req = request(vcpus=4, mem=4096, start=start, end=start + 80)
        assert warm.place(req).to_dict() == cold.place(req).to_dict()
