"""Resources, hosts and the per-host timeline."""

import math

import pytest

from placement import Allocation, Host, Request, Resources
from placement.time_index import TimeIndex
from placement.timeline import HostTimeline
from placement.vectors import ResourceSpace

R = Resources


def test_resources_add_subtract_and_extras():
    a = R(2, 1024, 10, {"gpu": 1})
    b = R(1, 512, 5)
    assert (a + b).as_dict() == {"vcpus": 3, "memory_mib": 1536, "disk_gib": 15, "gpu": 1}
    assert (a - b).get("gpu") == 1
    assert b.fits_in(a) and not a.fits_in(b)
    assert R.from_dict(a.as_dict()) == a


def test_usable_capacity_is_total_minus_reserved_times_ratio():
    h = Host("h", R(16, 65536, 1000), reserved=R(2, 4096, 100), overcommit={"vcpus": 4})
    assert h.usable() == R(56, 61440, 900)


def test_it_rejects_windows_that_end_before_they_start():
    with pytest.raises(ValueError):
        Allocation("a", R(1), 10, 5)
    with pytest.raises(ValueError):
        Request(R(1), start=10, end=10)


def test_timeline_peak_is_the_max_over_the_window():
    space = ResourceSpace()
    tl = HostTimeline(len(space))
    tl.add("a", 0, 10, space.vector(R(1, 100, 0), vms=1))
    tl.add("b", 5, 15, space.vector(R(2, 200, 0), vms=1))
    tl.add("c", 20, math.inf, space.vector(R(4, 400, 0), vms=1))
    assert tl.peak(0, 5)[:2] == [1, 100]
    assert tl.peak(0, 6)[:2] == [3, 300]  # a and b overlap on [5, 10)
    assert tl.peak(10, 20)[:2] == [2, 200]  # [a, b) half-open: a gone at 10
    assert tl.peak(15, 20)[:2] == [0, 0]
    assert tl.peak(19, math.inf)[:2] == [4, 400]
    assert tl.usage_at(7)[3] == 2  # two VMs


def test_earliest_start_looks_at_allocation_ends():
    space = ResourceSpace()
    tl = HostTimeline(len(space))
    tl.add("a", 0, 100, space.vector(R(4, 0, 0), vms=1))
    cap = space.vector(R(4, 0, 0), vms=math.inf)
    need = space.vector(R(2, 0, 0), vms=1)
    assert tl.earliest_start(need, cap, 10, not_before=0) == 100
    assert tl.earliest_start(need, cap, 10, not_before=150) == 150
    too_big = space.vector(R(5, 0, 0), vms=1)
    assert tl.earliest_start(too_big, cap, 10, 0) is None


def test_time_index_finds_overlapping_hosts_including_long_ones():
    idx = TimeIndex(10, ncols=1)
    idx.add("short", 1, 0, 5, [1.0])
    idx.add("later", 2, 30, 35, [2.0])
    idx.add("open", 3, 100, math.inf, [3.0])
    idx.add("long", 4, 0, 10_000, [4.0])
    idx.add("spans", 5, 8, 25, [5.0])  # three buckets: counted once
    assert idx.hosts_overlapping(0, 1) == {1, 4}
    assert idx.hosts_overlapping(5, 30) == {4, 5}  # half-open ends
    assert idx.hosts_overlapping(31, 32) == {2, 4}
    assert idx.hosts_overlapping(200, math.inf) == {3, 4}
    hits = idx.overlapping(5, 30)
    assert sorted(hits.cols[:, 0].tolist()) == [4.0, 5.0]  # each row once, with its columns
    idx.add("second", 5, 20, 22, [6.0])
    hits = idx.overlapping(15, 28)
    order, run_starts, counts = hits.runs()
    assert dict(zip(hits.hosts().tolist(), counts.tolist(), strict=True)) == {4: 1, 5: 2}
    idx.set_cols("second", [7.0])
    assert sorted(idx.overlapping(15, 28).cols[:, 0].tolist()) == [4.0, 5.0, 7.0]
    idx.remove("long")
    assert idx.hosts_overlapping(5, 30) == {5}
    for alloc_id in ("short", "later", "open", "spans", "second"):
        idx.remove(alloc_id)
    assert len(idx) == 0 and not idx.buckets and not idx.starts
    assert len(idx.overlapping(0, math.inf)) == 0
