"""Reason trail, rate-limit buckets and lock declarations: pure functions."""

import pytest

from jobs import locks, reasons


@pytest.mark.parametrize(
    "text, expected",
    [
        ("rate-limit:7:maintenance 123", ("rate-limit:7:maintenance 123", 7)),
        ("rate-limit:1:x", ("rate-limit:1:x", 1)),
        ("just a reason", None),
        ("Rate-limit:2:x", None),  # prefix is case-sensitive, as in Ganeti
    ],
)
def test_it_reads_rate_limit_buckets(text, expected):
    assert reasons.bucket(text) == expected


@pytest.mark.parametrize(
    "text",
    ["rate-limit:", "rate-limit:x:label", "rate-limit:0:label", "rate-limit:7:", "rate-limit:7: ", "rate-limit:7"],
)
def test_it_rejects_malformed_rate_limit_reasons(text):
    with pytest.raises(reasons.BadReason):
        reasons.check(text)


def test_it_rejects_empty_and_long_reasons():
    for bad in ["", "   ", "x" * 1001, 12]:
        with pytest.raises(reasons.BadReason):
            reasons.check(bad)


def test_buckets_of_a_trail_are_deduplicated_and_keyed_by_the_whole_reason():
    trail = [
        reasons.entry("cli", "rate-limit:2:maint"),
        reasons.entry("api", "rate-limit:3:maint"),
        reasons.entry("job", "rate-limit:2:maint"),
        reasons.entry("x", "because"),
    ]
    assert reasons.buckets(trail) == [["rate-limit:2:maint", 2], ["rate-limit:3:maint", 3]]
    assert reasons.label("rate-limit:2:maint") == "maint"


def test_locks_imply_the_cluster_lock_shared_and_keep_the_stronger_mode():
    assert locks.normalize(["vm:7", ("hypervisor:3", "shared"), ("vm:7", "shared")]) == [
        ["cluster", "shared"],
        ["hypervisor:3", "shared"],
        ["vm:7", "exclusive"],
    ]
    assert locks.normalize([("cluster", "exclusive")]) == [["cluster", "exclusive"]]
    assert locks.normalize([]) == []


@pytest.mark.parametrize("bad", ["VM:7", "vm 7", "", ("vm:7", "sometimes"), "x" * 101])
def test_it_rejects_bad_lock_declarations(bad):
    with pytest.raises(locks.BadLock):
        locks.normalize([bad])


def test_lock_table_conflicts():
    table = locks.LockTable()
    table.add(1, locks.normalize([("hypervisor:3", "shared")]))
    assert table.conflict(locks.normalize([("hypervisor:3", "shared")])) is None
    assert table.conflict(locks.normalize(["hypervisor:3"])) == ("hypervisor:3", [1])
    assert table.conflict(locks.normalize(["vm:1"])) is None
    assert table.conflict(locks.normalize([("cluster", "exclusive")])) == ("cluster", [1])
