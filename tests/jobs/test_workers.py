"""The job system with REAL django-q2 worker processes on the test database.

The tests share one qcluster of four workers (``workers``); a test about a worker's own life
(killed, or with another task timeout) starts its own (``start_workers``). Each submits through
the services like any interface would, and watches the Job rows — the truth — while the workers run them.
Concurrency is checked twice: by a ``Gauge`` row the jobs' steps count themselves in and
out of (one UPDATE also records the peak, so no breach slips between two samples), and
afterwards from the jobs' [started, ended] intervals.
"""

import os
import signal
import time

import pytest
from django.conf import settings

from jobs import services
from jobs.models import Gauge, Job
from tests import processes
from tests.jobs.helpers import max_overlap, refresh, submit, wait_until

pytestmark = pytest.mark.slow

# What the shared cluster keeps between tests is in the database: the queue settings a test
# sets are read at each claim and emptied with the rest (see committed_db).
worker_process = processes.shared(processes.start_worker, workers=4)
transactional_db, db = processes.committed_db, processes.committed_db_too


@pytest.fixture
def workers(transactional_db, worker_process):
    from django_q.brokers import get_broker

    get_broker().purge_queue()  # with Redis, the queue outlives the rows of the test before
    return worker_process.begin()


def test_django_q_timeout_is_shorter_than_retry():
    # A task running longer than `retry` would be delivered a second time.
    assert settings.Q_CLUSTER["timeout"] < settings.Q_CLUSTER["retry"]


def all_final(jobs):
    return all(refresh(job).is_final for job in jobs)


def wait_final(jobs, child, timeout=60):
    wait_until(lambda: all_final(jobs), timeout, "the jobs to end", child)
    return [refresh(job) for job in jobs]


def gauge(name):
    """A fresh ``Gauge``; ``test.sleep`` jobs with ``"gauge": name`` count their steps in it."""
    Gauge.objects.create(name=name)
    return name


def peak(name):
    """The most steps that ran at once (at least 1, so a check of it is never vacuous)."""
    row = Gauge.objects.get(name=name)
    assert row.peak >= 1, f"no step of {name} ran"
    return row.peak


# A cluster of their own, run before the shared one starts (it would take their jobs too).


def _worker_pid(job):
    return int(refresh(job).runner.rsplit(":", 1)[1])


def test_a_killed_worker_is_recovered_and_the_job_resumes(start_workers):
    services.set_queue_settings(actor="test", lease_seconds=2)
    child = start_workers(2)
    job = submit("test.sleep", {"steps": 6, "seconds": 0.5})
    wait_until(lambda: len(refresh(job).steps) >= 2, 30, "two steps to complete", child)
    pid = _worker_pid(job)
    os.kill(pid, signal.SIGKILL)  # the worker process dies mid-step
    killed_at = time.monotonic()
    job = wait_final([job], child, timeout=45)[0]
    assert job.status == "success", job.error_message
    assert job.attempt == 2 and _worker_pid(job) != pid
    messages = list(job.log_entries.values_list("message", flat=True))
    assert any("stopped renewing the lease" in m and "will resume after step 'sleep" in m for m in messages)
    assert sum("'sleep 1' done" in m for m in messages) == 1  # completed steps are not run again
    assert [s["name"] for s in job.steps] == [f"sleep {i}" for i in range(1, 7)]
    assert time.monotonic() - killed_at < 30


def test_a_killed_worker_fails_the_job_when_attempts_are_used_up(start_workers):
    services.set_queue_settings(actor="test", lease_seconds=2, max_attempts=1)
    child = start_workers(2)
    job = submit("test.sleep", {"steps": 20, "seconds": 0.5})
    wait_until(lambda: len(refresh(job).steps) >= 1, 30, "a step to complete", child)
    os.kill(_worker_pid(job), signal.SIGKILL)
    job = wait_final([job], child, timeout=30)[0]
    assert job.status == "error" and job.error_kind == "lost"
    assert "stopped renewing the lease" in job.error_message and "giving up" in job.error_message
    assert not Job.objects.filter(status="running").exists()


def test_long_jobs_hand_off_instead_of_hitting_the_task_timeout(start_workers):
    # With a 3 s task timeout a worker may run jobs for 1.5 s per task; this job needs 2.4 s.
    child = start_workers(2, VCLMGR_TASK_TIMEOUT=3)
    job = submit("test.sleep", {"steps": 8, "seconds": 0.3})
    job = wait_final([job], child, timeout=45)[0]
    assert job.status == "success" and job.attempt == 1
    assert job.log_entries.filter(message__startswith="continuing in a fresh task").exists()


def test_dependencies_chains_and_events(workers):
    child = workers
    first = submit("test.sleep", {"seconds": 0.5})
    after = submit(depends=[first.pk])
    only_on_error = submit(depends=[[first.pk, ["error"]]])
    chain = [submit()]
    for _ in range(7):
        chain.append(submit(depends=[chain[-1].pk]))
    first, after, only_on_error, *chain = wait_final([first, after, only_on_error, *chain], child)
    assert first.status == after.status == "success"
    assert after.started >= first.ended
    assert only_on_error.status == "error" and only_on_error.error_kind == "dependency"
    assert only_on_error.error_message == f"dependency job {first.pk} ended success; accepted: error"
    assert all(job.status == "success" for job in chain)
    for previous, job in zip(chain, chain[1:], strict=False):
        assert job.started >= previous.ended
    # Status changes and log lines written by the worker processes are events.
    from core.models import Event

    kinds = Event.objects.filter(topic=f"job.{first.pk}").order_by("id").values_list("kind", "data")
    statuses = [data["status"] for kind, data in kinds if kind == "job.status"]
    assert statuses[0] == "queued" and "running" in statuses and statuses[-1] == "success"
    assert any(kind == "job.log" and "started on" in data["message"] for kind, data in kinds)


def test_rate_limit_buckets_are_never_exceeded(workers):
    child = workers
    bucket = "rate-limit:2:maintenance 123"
    counted = {"seconds": 0.6, "gauge": gauge("limited")}
    limited = [submit("test.sleep", counted, reason=bucket) for _ in range(6)]
    free = [submit("test.sleep", {"seconds": 0.6}) for _ in range(2)]
    limited = wait_final(limited, child)
    free = wait_final(free, child)
    assert all(job.status == "success" for job in limited + free)
    assert peak("limited") <= 2  # never exceeded
    assert max_overlap(limited) == 2
    assert max_overlap(limited + free) >= 3  # the bucket holds back only its own jobs


def test_the_global_limit_changes_at_run_time(workers):
    services.set_queue_settings(actor="test", limit=1)
    child = workers
    counted = {"seconds": 0.5, "gauge": gauge("all")}
    jobs = [submit("test.sleep", counted) for _ in range(8)]
    wait_until(lambda: Job.objects.filter(status="success").count() >= 2, 30, "two jobs to finish", child)
    assert peak("all") == 1
    changed_at = services.set_queue_settings(actor="test", limit=3).updated
    jobs = wait_final(jobs, child)
    assert all(job.status == "success" for job in jobs)
    assert peak("all") <= 3 and Gauge.objects.get(name="all").value == 0
    assert max_overlap([j for j in jobs if j.ended <= changed_at]) == 1
    assert max_overlap(jobs) == 3


def test_lock_conflicts_wait(workers):
    child = workers
    holder = submit("test.sleep", {"steps": 3, "seconds": 0.5, "locks": ["vm:7"]})
    wait_until(lambda: refresh(holder).status == "running", 30, "the holder to start", child)
    blocked = submit("test.sleep", {"seconds": 0.1, "shared_locks": ["vm:7"]})
    free = submit("test.sleep", {"seconds": 0.1, "locks": ["vm:8"]})
    blocked_row = wait_until(
        lambda: (row := refresh(blocked)).status == "waiting" and row, 30, "the conflicting job to wait", child
    )
    assert blocked_row.waiting_for == f"lock vm:7 held by job {holder.pk}"
    holder, blocked, free = wait_final([holder, blocked, free], child)
    assert free.ended < holder.ended  # no conflict: ran alongside
    assert blocked.started >= holder.ended


def test_expansion(workers, admin_user):
    child = workers
    good = services.submit(
        "test.expand", {"children": [{"opcode": "test.sleep", "params": {"seconds": 0.3}}] * 3}, actor=admin_user
    )
    bad = services.submit(
        "test.expand",
        {"children": [{"opcode": "noop"}, {"opcode": "test.fail", "params": {"message": "broken disk"}}]},
        actor=admin_user,
    )
    good, bad = wait_final([good, bad], child)
    kids = list(good.children.all())
    assert good.status == "success" and len(kids) == 3
    assert all(kid.status == "success" and kid.ended <= good.ended for kid in kids)
    failed_kid = bad.children.get(opcode="test.fail")
    assert bad.status == "error" and bad.error_kind == "children"
    assert bad.error_message == f"1 of 2 child jobs did not succeed: job {failed_kid.pk} error (Failure: broken disk)"


def test_cancel_running_and_queued_jobs(workers):
    services.set_queue_settings(actor="test", limit=1)
    child = workers
    running = submit("test.sleep", {"steps": 30, "seconds": 0.2})
    queued = submit("test.sleep", {"seconds": 0.1})
    wait_until(lambda: len(refresh(running).steps) >= 1, 30, "a step to complete", child)
    services.cancel(refresh(queued), actor="test")
    assert refresh(queued).status == "canceled"  # at once
    services.cancel(refresh(running), actor="test", reason="enough")
    running = wait_final([running], child, timeout=15)[0]
    assert running.status == "canceled"
    assert running.error_message.startswith("canceled after step 'sleep")
    assert len(running.steps) < 30


def test_retry_runs_a_new_linked_job(workers):
    child = workers
    failed = submit("test.fail")
    wait_final([failed], child)
    retried = services.retry(refresh(failed), actor="test")
    retried = wait_final([retried], child)[0]
    assert retried.retry_of_id == failed.pk and retried.status == "error" and retried.attempt == 1


def test_a_long_step_keeps_its_lease(workers):
    # The heartbeat thread renews a 2 s lease through a 4 s step: no false recovery.
    services.set_queue_settings(actor="test", lease_seconds=2)
    child = workers
    job = wait_final([submit("test.sleep", {"seconds": 4})], child)[0]
    assert job.status == "success" and job.attempt == 1
    assert not job.log_entries.filter(message__contains="stopped renewing").exists()
