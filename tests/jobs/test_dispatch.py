"""claim_next on the database: order, limit, buckets, locks, dependencies, and races."""

import threading

import pytest
from django.db import connection

from jobs import dispatcher, services
from jobs.models import Job
from tests.jobs.helpers import refresh, submit


def claim_all():
    claimed = []
    while (claim := dispatcher.claim_next()) is not None:
        claimed.append(claim.id)
    return claimed


@pytest.mark.django_db
def test_higher_priority_first_then_submission_order(sync_jobs):
    low, normal, high, normal2 = submit(priority=-5), submit(), submit(priority=10), submit()
    assert claim_all() == [high.pk, normal.pk, normal2.pk, low.pk]


@pytest.mark.django_db
def test_the_limit_is_read_at_every_claim(sync_jobs):
    services.set_queue_settings(actor="test", limit=2)
    jobs = [submit() for _ in range(5)]
    assert claim_all() == [jobs[0].pk, jobs[1].pk]
    services.set_queue_settings(actor="test", limit=4)
    assert claim_all() == [jobs[2].pk, jobs[3].pk]
    assert refresh(jobs[4]).status == "queued"


@pytest.mark.django_db
def test_a_claim_says_how_many_more_could_start(sync_jobs):
    services.set_queue_settings(actor="test", limit=3)
    for _ in range(5):
        submit()
    assert dispatcher.claim_next().more == 2
    assert dispatcher.eligible_count() == 2


@pytest.mark.django_db
def test_a_bucket_caps_its_jobs(sync_jobs):
    limited = [submit(reason="rate-limit:2:maintenance 123") for _ in range(3)]
    other = submit(reason="just because")
    assert claim_all() == [limited[0].pk, limited[1].pk, other.pk]
    waiting = refresh(limited[2])
    assert waiting.status == "queued"
    assert waiting.waiting_for == "rate-limit bucket 'maintenance 123': 2 of 2 running"


@pytest.mark.django_db
def test_lock_conflicts_show_waiting_with_what_for(sync_jobs):
    holder = submit("test.sleep", {"locks": ["vm:7"]})
    blocked = submit("test.sleep", {"shared_locks": ["vm:7"]})
    free = submit("test.sleep", {"locks": ["vm:8"]})
    assert claim_all() == [holder.pk, free.pk]
    blocked = refresh(blocked)
    assert blocked.status == "waiting"
    assert blocked.waiting_for == f"lock vm:7 held by job {holder.pk}"


@pytest.mark.django_db
def test_an_exclusive_cluster_job_is_not_starved(sync_jobs):
    first = submit("test.sleep", {"locks": ["vm:1"]})
    cluster = submit("test.sleep", {"locks": ["cluster"]})
    later = submit("test.sleep", {"locks": ["vm:2"]})
    assert claim_all() == [first.pk]
    assert refresh(later).waiting_for == f"lock cluster: in line behind job {cluster.pk}"


@pytest.mark.django_db
def test_dependencies_are_honoured(sync_jobs):
    first = submit("test.sleep", {"seconds": 0})
    second = submit(depends=[first.pk])
    assert refresh(second).status == "waiting"
    assert sync_jobs.drain() == [(first.pk, "success"), (second.pk, "success")]
    assert refresh(second).started >= refresh(first).ended


@pytest.mark.django_db
def test_a_chain_runs_strictly_in_order(sync_jobs):
    chain = [submit()]
    for _ in range(19):
        chain.append(submit(depends=[chain[-1].pk]))
    order = [job_id for job_id, _ in sync_jobs.drain()]
    assert order == [job.pk for job in chain]


@pytest.mark.file_db
@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_exceed_the_limit(sync_jobs):
    """Many threads (own connections) claim at once: each job once, never more than the limit."""
    services.set_queue_settings(actor="test", limit=5)
    jobs = [submit(reason="rate-limit:3:race") if i % 2 else submit() for i in range(20)]
    claims, errors = [], []
    barrier = threading.Barrier(8)

    def worker():
        try:
            barrier.wait()
            for _ in range(10):
                claim = dispatcher.claim_next()
                if claim:
                    claims.append(claim.id)
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(claims) == len(set(claims)) == 5
    running = Job.objects.filter(status="running")
    assert running.count() == 5
    assert sum(1 for job in running if job.buckets) <= 3
    assert {job.pk for job in jobs} >= set(claims)
