"""Each check rejects for its own reason, and the refusal counts it."""

import pytest

from placement import Host, PlacementEngine, PlacementOptions, Request, place

from .helpers import R, alloc, cluster, group, host, request


def refusal(c, r):
    result = place(c, r)
    assert not result.ok, result
    return dict(result.reasons)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"state": "offline"}, "offline"),
        ({"state": "drained"}, "drained"),
        ({"hypervisor": "esx"}, "wrong_hypervisor"),
        ({"tags": frozenset({"gpu"})}, "forbidden_tag"),
        ({"max_vms": 1, "allocations": (alloc("x"),)}, "max_vms"),
    ],
)
def test_it_counts_static_and_vm_limit_reasons(kwargs, reason):
    c = cluster(host("h", **kwargs))
    r = request(hypervisors=frozenset({"kvm"}), forbidden_tags=frozenset({"gpu"}))
    assert refusal(c, r) == {reason: 1}


def test_it_rejects_hosts_missing_a_required_tag():
    c = cluster(host("a", tags=frozenset({"ssd"})), host("b"))
    result = place(c, request(required_tags=frozenset({"ssd", "fast"})))
    assert dict(result.reasons) == {"missing_tag": 2}


def test_a_refusal_names_the_required_tag_no_host_has():
    c = cluster(host("a", tags=frozenset({"ssd"})), host("b"))
    result = place(c, request(required_tags=frozenset({"gpu"})))
    assert result.note == "no host has tag gpu" and "no host has tag gpu" in result.explained()
    result = place(c, request(required_tags=frozenset({"gpu", "ssd", "tpu"})))
    assert result.note == "no host has tags gpu, tpu"
    c = cluster(host("a", tags=frozenset({"ssd"})), host("b", tags=frozenset({"gpu"})))
    result = place(c, request(required_tags=frozenset({"gpu", "ssd"})))
    assert result.note == "no host has all of the tags gpu, ssd"
    # A tag that exists, on a host that is merely full, needs no note: the counts say it.
    c = cluster(host("a", tags=frozenset({"gpu"}), allocations=(alloc("x", vcpus=16),)), host("b"))
    result = place(c, request(required_tags=frozenset({"gpu"})))
    assert not result.ok and result.note == ""


def test_it_never_uses_unallocatable_groups():
    c = cluster(host("h", group="g"), groups=[group("g", "unallocatable")])
    assert refusal(c, request()) == {"group_unallocatable": 1}


def test_it_restricts_to_requested_groups():
    c = cluster(host("a", group="g1"), host("b", group="g2"))
    result = place(c, request(groups=frozenset({"g2"})))
    assert result.host == "b"


def test_it_needs_exclusive_storage_when_asked():
    c = cluster(host("plain"), host("excl", exclusive_storage=True))
    assert place(c, request(exclusive_storage=True)).host == "excl"
    c2 = cluster(host("plain"))
    assert refusal(c2, request(exclusive_storage=True)) == {"exclusive_storage": 1}


def test_anti_affinity_only_conflicts_in_overlapping_time():
    partner = alloc("p", start=0, end=100, anti_affinity="class-7")
    c = cluster(host("h", allocations=(partner,)))
    assert refusal(c, request(start=50, end=150, anti_affinity="class-7")) == {"anti_affinity": 1}
    assert place(c, request(start=100, end=150, anti_affinity="class-7")).host == "h"
    assert place(c, request(start=50, end=150, anti_affinity="other")).host == "h"


@pytest.mark.parametrize(
    "need, reason",
    [
        (R(17, 1, 1), "lacks_vcpus"),
        (R(1, 70000, 1), "lacks_memory_mib"),
        (R(1, 1, 2000), "lacks_disk_gib"),
    ],
)
def test_it_names_the_lacking_resource(need, reason):
    c = cluster(host("h", vcpus=16, mem=65536, disk=1000))
    assert refusal(c, Request(need)) == {reason: 1}


def test_an_extra_resource_nobody_has_is_lacking_everywhere():
    c = cluster(host("a"), host("b", state="drained"))
    result = place(c, Request(R(1, 1, 1, {"gpu": 1})))
    assert dict(result.reasons) == {"drained": 1, "lacks_gpu": 1}
    assert "lack gpu" in str(result)


def test_extras_are_capacity_like_any_other():
    c = cluster(Host("g", R(8, 1024, 10, {"gpu": 2})))
    engine = PlacementEngine(c)
    for rid in ("r1", "r2"):
        engine.commit(engine.place(Request(R(1, 1, 1, {"gpu": 1}), id=rid)))
    third = engine.place(Request(R(1, 1, 1, {"gpu": 1}), id="r3"))
    assert dict(third.reasons) == {"lacks_gpu": 1}


def test_capacity_counts_the_peak_of_overlapping_allocations():
    busy = (alloc("a", mem=40000, start=0, end=10), alloc("b", mem=20000, start=5, end=20))
    c = cluster(host("h", mem=65536, allocations=busy))
    assert not place(c, request(mem=10000, start=0, end=20)).ok  # peak 60000 at [5, 10)
    assert place(c, request(mem=10000, start=10, end=20)).ok  # only b there
    assert place(c, request(mem=45000, start=20, end=30)).ok


def test_each_rejected_host_is_counted_once_under_its_first_failed_check():
    c = cluster(
        host("off", state="offline", hypervisor="esx"),
        host("small", mem=1024, hypervisor="esx"),
        host("ok-type-small", mem=1024),
    )
    result = place(c, request(mem=4096, hypervisors=frozenset({"kvm"})))
    assert dict(result.reasons) == {"offline": 1, "wrong_hypervisor": 1, "lacks_memory_mib": 1}


def test_explain_counts_rejections_on_success_too():
    c = cluster(host("a", state="drained"), host("b"))
    quiet = place(c, request())
    loud = place(c, request(), PlacementOptions(explain=True))
    assert quiet.host == loud.host == "b"
    assert dict(quiet.reasons) == {}
    assert dict(loud.reasons) == {"drained": 1}


def test_a_host_leaving_service_takes_only_what_ends_by_then():
    leaving = host("leaving", available_until=100.0)
    c = cluster(leaving)
    engine = PlacementEngine(c)
    assert engine.place(request(start=0, end=100)).host == "leaving"
    # the static view is cached per engine: a later end in the same engine is still refused
    assert dict(engine.place(request(start=0, end=101)).reasons) == {"retiring": 1}
    assert dict(engine.place(request(start=0, end=None)).reasons) == {"retiring": 1}
    assert "1 leaving service before the end" in engine.place(request(start=0, end=500)).explained()
    assert engine.earliest_fit(request(start=0, end=500), 500, 0).start is None
    both = cluster(leaving, host("staying"))
    assert place(both, request(start=0, end=500)).host == "staying"
