"""Fencing in-process: once another run took the job over, the old run writes nothing more
(no step record, no log line, no end) and makes no further driver call.

A takeover here is what the janitor and a second worker do: the lease is let expire (its
``lease_until`` moved into the past, as when the heartbeat stops), ``recover_expired``
requeues the job and a new claim raises its generation. The cross-process version, with a
worker frozen by SIGSTOP in the middle of a real ``vm.create``, is
tests/provisioning/test_fencing.py.
"""

import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core import fencing
from drivers import registry as drivers
from drivers.sim.driver import SimDriver
from inventory.models import Hypervisor
from jobs import dispatcher, kept_records, runner, tasks
from jobs.models import Gauge, Job, JobLog
from tests.jobs.helpers import refresh, submit

pytestmark = pytest.mark.django_db


def _take_over(job):
    """Expire the lease, let the janitor requeue the job and a second worker claim it."""
    Job.objects.filter(pk=job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert tasks.recover_expired() == 1
    claim = dispatcher.claim_next(runner="second:1")
    assert claim is not None and claim.id == job.pk
    return claim


def _first_run(sync_jobs):
    job = submit("test.sleep", {"steps": 3, "seconds": 0})
    claim = dispatcher.claim_next(runner="first:1")
    lease = runner.Lease(claim.id, claim.token, claim.job.attempt, claim.lease_seconds)
    end = runner._Ender(claim.job, lease, None)
    return job, claim, lease, runner.JobContext(claim.job, lease, time.monotonic() + 60, end=end)


def test_every_takeover_raises_the_generation(sync_jobs):
    job, claim, lease, _ = _first_run(sync_jobs)
    assert lease.generation == 1
    second = _take_over(job)
    assert second.job.attempt == 2 and second.token != claim.token


def test_the_old_run_can_neither_step_nor_log_nor_end(sync_jobs, monkeypatch):
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step("one", lambda: 1)
    # A real takeover comes a lease after the old run's last write, far past the window in
    # which a step trusts the record before it.
    monkeypatch.setattr(runner, "FRESH_SECONDS", 0)
    _take_over(job)
    before = (refresh(job).steps, JobLog.objects.filter(job=job).count())
    ran = []
    with pytest.raises(runner.LeaseLost):
        ctx.step("two", ran.append, 2)  # the check before the step is a conditional write
    assert ran == []
    with pytest.raises(runner.LeaseLost):
        ctx.log("the old run still talking")
    with pytest.raises(runner.LeaseLost):
        ctx._record("two", 2)
    ended = runner._Ender(ctx.job, lease, None)(Job.Status.SUCCESS, result={"by": "the old run"})
    assert ended == ("lost", None)
    job = refresh(job)
    assert (job.steps, JobLog.objects.filter(job=job).count()) == before
    assert job.status == "running" and job.result is None and job.runner == "second:1"
    assert not JobLog.objects.filter(job=job, message__contains="old run").exists()


def test_a_step_right_after_a_record_trusts_it_and_one_later_checks_again(sync_jobs, monkeypatch):
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step("one", lambda: 1)
    with CaptureQueriesContext(connection) as right_after:
        ctx.checkpoint()  # the record proved the lease ours and read the cancel flag just now
    assert len(right_after) == 0
    ctx.step("two", lambda: 2)
    monkeypatch.setattr(runner, "FRESH_SECONDS", 0)
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    with pytest.raises(runner.Canceled):
        ctx.checkpoint()


def test_the_new_run_finishes_with_its_own_result(sync_jobs):
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step("one", lambda: 1)
    second = _take_over(job)
    assert runner.execute(second.id, second.token, time.monotonic() + 60, second.job, second.lease_seconds) == "success"
    assert runner._Ender(ctx.job, lease, None)(Job.Status.ERROR, error="late", trace="old traceback") == ("lost", None)
    job = refresh(job)
    assert job.status == "success" and job.attempt == 2 and job.error_message == ""
    assert not JobLog.objects.filter(job=job, message="old traceback").exists()


@pytest.fixture
def sim_driver(db):
    host = Hypervisor.objects.create(
        name="sim-f", address="sim-f.example.org", driver="sim", cpus=8, memory_mib=8192, disk_gib=100
    )
    return drivers.driver_for(host)


@pytest.fixture
def sim_calls(monkeypatch):
    """Every call that reaches the simulated hypervisor (a spy on the real driver)."""
    calls = []
    real = SimDriver._step

    def spy(self, step):
        calls.append(step)
        return real(self, step)

    monkeypatch.setattr(SimDriver, "_step", spy)
    return calls


def test_a_driver_call_after_the_takeover_never_reaches_the_host(sync_jobs, sim_driver, sim_calls):
    job, claim, lease, ctx = _first_run(sync_jobs)
    with fencing.holding(lease):
        sim_driver.facts()
        assert sim_calls == ["facts"]
        _take_over(job)
        # Within the trusted window nobody can have taken over (the clocks agree): to stand
        # for a worker that was frozen past its lease, age the last confirmation.
        lease.confirmed -= lease.lease_seconds
        with pytest.raises(runner.LeaseLost):
            sim_driver.facts()
        assert lease.lost
        with pytest.raises(runner.LeaseLost):  # and it stays lost, without asking again
            sim_driver.list_vms()
    assert sim_calls == ["facts"]
    sim_driver.facts()  # outside a run nothing is fenced
    assert sim_calls == ["facts", "facts"]


def test_a_driver_call_within_the_trusted_window_costs_no_statement(sync_jobs, sim_driver, django_assert_num_queries):
    job, claim, lease, ctx = _first_run(sync_jobs)
    sim_driver.facts()  # the simulated host row exists now
    with fencing.holding(lease), django_assert_num_queries(0):
        lease.check()
        lease.check()


def test_a_renewal_that_matches_nothing_marks_the_lease_lost(sync_jobs):
    job, claim, lease, ctx = _first_run(sync_jobs)
    _take_over(job)
    with pytest.raises(runner.LeaseLost):
        lease.renew()
    assert lease.lost
    assert refresh(job).runner == "second:1"


def test_a_database_step_of_the_old_run_is_rolled_back_whole(sync_jobs):
    # A database-only step runs in its record's transaction: the record, conditional on the
    # lease, matches nothing for the old run, and the step's own writes go with it.
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step("one", lambda: 1)
    _take_over(job)
    before = refresh(job).steps
    with pytest.raises(runner.LeaseLost):
        ctx.db_step("two", lambda: Gauge.objects.create(name="written by the old run").pk)
    assert not Gauge.objects.filter(name="written by the old run").exists()
    assert refresh(job).steps == before
    with pytest.raises(runner.LeaseLost):  # and nothing more from it, even without a write
        ctx.db_step("three", lambda: Gauge.objects.create(name="later").pk)
    assert not Gauge.objects.filter(name="later").exists()


@pytest.mark.parametrize("kind", ["db_step", "last_db_step"])
def test_a_cancel_asked_while_a_database_step_runs_undoes_the_step(sync_jobs, kind):
    job, claim, lease, ctx = _first_run(sync_jobs)

    def step():
        Gauge.objects.create(name="made by the step")
        Job.objects.filter(pk=job.pk).update(cancel_requested=True)  # a user's cancel, meanwhile
        return 1

    with pytest.raises(runner.Canceled):
        getattr(ctx, kind)("one", step)
    assert not Gauge.objects.filter(name="made by the step").exists()
    assert refresh(job).status == "running" and refresh(job).steps == [] and ctx._steps == [] and ctx.ended is None


def test_a_database_step_commits_with_its_record(sync_jobs):
    job, claim, lease, ctx = _first_run(sync_jobs)
    assert ctx.db_step("one", lambda: Gauge.objects.create(name="kept").pk) == Gauge.objects.get(name="kept").pk
    assert [s["name"] for s in refresh(job).steps] == ["one"]
    assert ctx.db_step("one-again", lambda: 2) == 2 and len(refresh(job).steps) == 2


def test_a_last_database_step_commits_with_the_end_of_its_job(sync_jobs):
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step("one", lambda: 1)
    assert ctx.last_db_step("two", lambda: Gauge.objects.create(name="kept").pk) == Gauge.objects.get(name="kept").pk
    assert ctx.ended == ("success", None)
    job = refresh(job)
    assert job.status == "success" and job.result == Gauge.objects.get(name="kept").pk
    assert [s["name"] for s in job.steps] == ["one", "two"] and job.progress["step"] == "two"
    lines = list(JobLog.objects.filter(job=job).order_by("id").values_list("message", flat=True))
    assert lines[-2:] == ["step 2 'two' done", "success"]


def test_a_last_database_step_of_the_old_run_is_rolled_back_whole(sync_jobs):
    job, claim, lease, ctx = _first_run(sync_jobs)
    _take_over(job)
    with pytest.raises(runner.LeaseLost):
        ctx.last_db_step("one", lambda: Gauge.objects.create(name="written by the old run").pk)
    assert not Gauge.objects.filter(name="written by the old run").exists()
    assert refresh(job).status == "running" and refresh(job).runner == "second:1"


def test_a_step_recorded_later_is_recorded_with_the_database_step_after_it(sync_jobs):
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step("one", lambda: 1)
    assert ctx.step_recorded_later("two", lambda: 2) == 2
    assert [s["name"] for s in refresh(job).steps] == ["one"]  # kept, not written yet
    with CaptureQueriesContext(connection) as queries:
        ctx.last_db_step("three", lambda: Gauge.objects.create(name="kept").pk)
    assert sum(q["sql"].lstrip().upper().startswith('UPDATE "JOBS_JOB"') for q in queries.captured_queries) == 1
    job = refresh(job)
    assert job.status == "success" and [s["name"] for s in job.steps] == ["one", "two", "three"]
    assert job.steps[1]["result"] == 2 and job.progress == {"done": 3, "total": None, "step": "three"}
    lines = list(JobLog.objects.filter(job=job).order_by("id").values_list("message", flat=True))
    assert lines[-3:] == ["step 2 'two' done", "step 3 'three' done", "success"]


def test_a_step_recorded_later_of_the_old_run_is_not_recorded(sync_jobs):
    # Its record rides on the next write of the run, which is lease-conditional: the new owner
    # runs the step again (it must be safe to repeat), and the old run's database step is undone.
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step_recorded_later("one", lambda: 1)
    _take_over(job)
    with pytest.raises(runner.LeaseLost):
        ctx.db_step("two", lambda: Gauge.objects.create(name="written by the old run").pk)
    assert not Gauge.objects.filter(name="written by the old run").exists()
    assert refresh(job).steps == []


@pytest.mark.parametrize("then", ["step", "end", "fail"])
def test_a_step_recorded_later_is_written_by_the_next_step_or_the_end(sync_jobs, then):
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step_recorded_later("one", lambda: 1)
    if then == "step":
        ctx.step("two", lambda: 2)
        assert [s["name"] for s in refresh(job).steps] == ["one", "two"]
        return
    fields = {"result": 1} if then == "end" else {"error": "boom", "kind": "exception"}
    assert ctx._end(runner.S.SUCCESS if then == "end" else runner.S.ERROR, **fields)[0] in ("success", "error")
    job = refresh(job)
    assert job.status in ("success", "error") and [s["name"] for s in job.steps] == ["one"]


def _carried_write(ctx, name):
    """A block of the run's own writes between steps (as a VM's state change at a step's start)."""
    with kept_records.running(ctx), transaction.atomic(), kept_records.carrying():
        return Gauge.objects.create(name=name).pk


def test_kept_records_ride_on_the_runs_next_own_write(sync_jobs):
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step_recorded_later("one", lambda: 1)
    with CaptureQueriesContext(connection) as queries:
        assert ctx.step_recorded_later("two", lambda: 2) == 2  # the claim just checked the lease: no check
    assert len(queries) == 0 and refresh(job).steps == []
    with CaptureQueriesContext(connection) as queries:
        _carried_write(ctx, "carrier")
    sql = [q["sql"].lstrip().upper() for q in queries.captured_queries]
    assert sum(s.startswith('UPDATE "JOBS_JOB"') for s in sql) == 1
    assert [s["name"] for s in refresh(job).steps] == ["one", "two"] and not ctx.keeps_records()
    with CaptureQueriesContext(connection) as queries:  # nothing kept: a plain block
        _carried_write(ctx, "plain")
    assert not any('"JOBS_JOB"' in q["sql"].upper() for q in queries.captured_queries)


def test_a_carried_write_of_the_old_run_is_rolled_back(sync_jobs, monkeypatch):
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step_recorded_later("one", lambda: 1)
    monkeypatch.setattr(runner, "FRESH_SECONDS", 0)
    _take_over(job)
    with pytest.raises(runner.LeaseLost):
        _carried_write(ctx, "written by the old run")
    assert not Gauge.objects.filter(name="written by the old run").exists()
    assert refresh(job).steps == []


def test_past_the_fresh_window_the_kept_records_are_the_check(sync_jobs, monkeypatch):
    job, claim, lease, ctx = _first_run(sync_jobs)
    ctx.step_recorded_later("one", lambda: 1)
    monkeypatch.setattr(runner, "FRESH_SECONDS", 0)
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    ran = []
    with pytest.raises(runner.Canceled):
        ctx.step("two", ran.append, 2)
    assert ran == [] and [s["name"] for s in refresh(job).steps] == ["one"]
