"""The hot path of the job system: query budget per job, batched log lines and events, the
one-statement conditional UPDATE, and the per-process heartbeat thread."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.models import Event
from jobs import runner, tasks, transitions, wake
from jobs.models import Gauge, Job, JobLog, update_returning
from tests.jobs.helpers import refresh, submit, wait_until

# Measured: 6 per submit and 9 per job run (BEGIN/COMMIT included). A budget, not a target:
# it fails when a change adds queries to every job.
SUBMIT_BUDGET = 7
RUN_BUDGET = 10


@pytest.mark.django_db
def test_a_noop_job_stays_within_its_query_budget(sync_jobs, monkeypatch):
    monkeypatch.setattr(wake, "top_up", lambda *args, **kwargs: 0)
    with CaptureQueriesContext(connection) as submitted:
        jobs = [submit() for _ in range(20)]
    with CaptureQueriesContext(connection) as ran:
        assert tasks.run_next() == 20
    assert len(submitted) <= SUBMIT_BUDGET * 20, len(submitted) / 20
    assert len(ran) <= RUN_BUDGET * 20, len(ran) / 20
    assert {refresh(job).status for job in jobs} == {"success"}


@pytest.mark.django_db
def test_a_batch_writes_log_lines_and_events_in_order_at_its_end():
    job = submit()
    with transaction.atomic(), transitions.batched():
        first = transitions.log(job, "one")
        transitions.emit_status(job)
        transitions.log(job, "two", "warning")
        assert first.pk is None  # not written yet
    lines = list(JobLog.objects.filter(job=job).values_list("message", flat=True))
    assert lines[-2:] == ["one", "two"]
    kinds = list(Event.objects.filter(topic=f"job.{job.pk}").order_by("id").values_list("kind", "data"))
    assert [kind for kind, _ in kinds[-3:]] == ["job.log", "job.status", "job.log"]
    assert kinds[-1][1]["message"] == "two" and kinds[-1][1]["id"] == JobLog.objects.get(message="two").pk


@pytest.mark.django_db
def test_a_batch_that_fails_writes_nothing():
    job = submit()
    before = Event.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic(), transitions.batched():
        transitions.log(job, "lost")
        raise RuntimeError
    assert not JobLog.objects.filter(message="lost").exists()
    assert Event.objects.count() == before


@pytest.mark.django_db
def test_lines_written_in_a_savepoint_inside_a_batch_roll_back_with_it():
    job = submit()
    with transaction.atomic(), transitions.batched():
        transitions.log(job, "kept")
        try:
            with transaction.atomic():
                transitions.log(job, "rolled back")
                raise RuntimeError
        except RuntimeError:
            pass
    messages = set(JobLog.objects.filter(job=job).values_list("message", flat=True))
    assert "kept" in messages and "rolled back" not in messages


@pytest.mark.django_db
def test_update_returning_gives_the_rows_as_updated_or_none():
    job = submit()
    rows = update_returning(Job.objects.filter(pk=job.pk, status="queued"), ["status", "params"], status="waiting")
    assert [(row.pk, row.status, row.params) for row in rows] == [(job.pk, "waiting", {})]
    assert update_returning(Job.objects.filter(pk=job.pk, status="queued"), ["status"], status="running") == []
    assert refresh(job).status == "waiting"


@pytest.mark.django_db(transaction=True)
def test_one_heartbeat_thread_renews_the_leases_of_running_jobs():
    jobs = [submit() for _ in range(2)]
    soon = timezone.now() + timedelta(seconds=1)
    for index, job in enumerate(jobs):
        Job.objects.filter(pk=job.pk).update(status="running", lease_token=f"t{index}", lease_until=soon)
    leases = [runner.Lease(job.pk, f"t{index}", 0, 2) for index, job in enumerate(jobs)]
    with runner.Heartbeat(leases[0]), runner.Heartbeat(leases[1]):
        # Renewed every lease/3 (0.67 s): both within a few seconds, by the one thread.
        wait_until(lambda: all(refresh(job).lease_until > soon for job in jobs), 10, "both leases renewed")
        assert sum(1 for thread in threading.enumerate() if thread.name == "jobs-heartbeat") == 1


@pytest.mark.django_db
def test_without_returning_old_sqlite_still_runs_jobs(sync_jobs, monkeypatch):
    # SQLite < 3.35 has no RETURNING: the hot path falls back to UPDATE then SELECT.
    monkeypatch.setattr(type(connection.features), "can_return_rows_from_bulk_insert", False)
    job = submit()
    assert sync_jobs.drain() == [(job.pk, "success")]
    assert refresh(job).status == "success"
    logged = Event.objects.filter(topic=f"job.{job.pk}", kind="job.log").order_by("id")
    assert [event.data["id"] for event in logged] == list(JobLog.objects.filter(job=job).values_list("id", flat=True))


@pytest.mark.django_db
def test_a_gauge_records_its_peak_in_the_same_update_that_counts_in():
    Gauge.objects.create(name="g")
    for change in (Gauge.enter, Gauge.enter, Gauge.leave, Gauge.enter, Gauge.leave, Gauge.leave):
        change("g")
    row = Gauge.objects.get(name="g")
    assert (row.value, row.peak) == (0, 2)
    with pytest.raises(Gauge.DoesNotExist):
        Gauge.enter("missing")
