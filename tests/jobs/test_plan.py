"""The dispatcher's pure decision: limits, buckets, locks, dependencies, order."""

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.dispatcher import Candidate, Running, plan
from jobs.locks import LockTable, normalize

X = normalize


def test_it_starts_by_priority_order_up_to_the_limit():
    result = plan([Candidate(3), Candidate(1), Candidate(2)], running=[Running(9)], limit=3)
    assert result.start == [3, 1]
    assert result.blocked == {2: ("queued", "global limit: 3 running")}


def test_a_full_limit_starts_nothing():
    assert plan([Candidate(1)], [Running(8), Running(9)], limit=2).start == []


def test_rate_limit_buckets_count_running_and_planned_jobs():
    bucket = [["rate-limit:2:maint", 2]]
    running = [Running(9, buckets=bucket)]
    result = plan([Candidate(i, buckets=bucket) for i in (1, 2, 3)] + [Candidate(4)], running, limit=10)
    assert result.start == [1, 4]
    assert result.blocked[2] == ("queued", "rate-limit bucket 'maint': 2 of 2 running")


def test_lock_conflicts_wait_and_say_for_whom():
    result = plan(
        [Candidate(1, locks=X(["vm:7"])), Candidate(2, locks=X(["vm:8"]))], [Running(5, locks=X(["vm:7"]))], 10
    )
    assert result.start == [2]
    assert result.blocked[1] == ("waiting", "lock vm:7 held by job 5")


def test_lock_waits_are_first_come_first_served():
    # 1 waits for the exclusive cluster lock; 2 (shared locks only) must not overtake it.
    running = [Running(5, locks=X(["vm:1"]))]
    candidates = [Candidate(1, locks=X([("cluster", "exclusive")])), Candidate(2, locks=X(["vm:2"])), Candidate(3)]
    result = plan(candidates, running, 10)
    assert result.start == [3]
    assert result.blocked[1] == ("waiting", "lock cluster held by job 5")
    assert result.blocked[2] == ("waiting", "lock cluster: in line behind job 1")


def test_dependencies_wait_fail_or_pass():
    candidates = [
        Candidate(1, deps=[(10, "running", ["success"])]),
        Candidate(2, deps=[(11, "error", ["success"])]),
        Candidate(3, deps=[(11, "error", [])]),
        Candidate(4, deps=[(12, "success", ["success"]), (11, "error", ["error", "canceled"])]),
    ]
    result = plan(candidates, [], 10)
    assert result.start == [3, 4]
    assert result.blocked[1] == ("waiting", "dependency: job 10 (running)")
    assert result.failed == {2: "dependency job 11 ended error; accepted: success"}


names = st.sampled_from(["vm:1", "vm:2", "hypervisor:1", "cluster"])
lock_lists = st.lists(st.tuples(names, st.sampled_from(["shared", "exclusive"])), max_size=3).map(X)
bucket_lists = st.lists(st.sampled_from([["rate-limit:1:a", 1], ["rate-limit:2:b", 2]]), max_size=2, unique_by=str)


@settings(max_examples=300, deadline=None)
@given(
    running=st.lists(st.tuples(lock_lists, bucket_lists), max_size=4),
    candidates=st.lists(st.tuples(lock_lists, bucket_lists), max_size=12),
    limit=st.integers(min_value=1, max_value=8),
)
def test_a_plan_never_breaks_the_limit_a_bucket_or_a_lock(running, candidates, limit):
    running_jobs = [Running(100 + i, locks=lk, buckets=b) for i, (lk, b) in enumerate(running)]
    cands = [Candidate(i, locks=lk, buckets=b) for i, (lk, b) in enumerate(candidates)]
    result = plan(cands, running_jobs, limit)
    started = [c for c in cands if c.id in result.start]
    assert len(running_jobs) + len(started) <= max(limit, len(running_jobs))
    if len(running_jobs) >= limit:
        assert started == []
    # Locks: the started jobs conflict neither with running jobs nor with each other.
    table = LockTable()
    for job in running_jobs:
        table.add(job.id, job.locks)
    for job in started:
        assert table.conflict(job.locks) is None
        table.add(job.id, job.locks)
    # Buckets: the started jobs never push a bucket past N (unless it was already past).
    for key, n in [["rate-limit:1:a", 1], ["rate-limit:2:b", 2]]:
        before = sum(1 for j in running_jobs if [key, n] in j.buckets)
        added = sum(1 for j in started if [key, n] in j.buckets)
        assert added == 0 or before + added <= n
    # Every candidate is decided.
    assert {c.id for c in cands} == set(result.start) | set(result.blocked) | set(result.failed)
