"""Running jobs in-process: steps, resume after a lost worker, cancel, hand-off, expansion."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from core import topics
from core.models import Event
from jobs import dispatcher, registry, runner, services, tasks
from jobs.models import Job
from tests.jobs.helpers import refresh, submit

pytestmark = pytest.mark.django_db

CALLS = []


class WorkerDied(BaseException):
    """Stands for the process dying mid-step: nothing after it runs."""


def _record(name):
    CALLS.append(name)
    return name


@registry.opcode("test.crashy", staff_only=False)
def crashy(job):
    """Dies in step 2 on its first attempt."""
    job.step("one", _record, "one")
    job.step("two", _crash_once, job.attempt)
    job.step("three", _record, "three")
    return {"calls": len(CALLS)}


def _crash_once(attempt):
    if attempt == 1:
        raise WorkerDied()
    return _record("two")


@registry.opcode("test.cancels_itself", staff_only=False)
def cancels_itself(job):
    job.step("one", lambda: services.cancel(Job.objects.get(pk=job.job_id), actor="someone") and 1)
    job.step("two", _record, "two")


@registry.opcode("test.bad_result", staff_only=False)
def bad_result(job):
    job.step("one", object)


@pytest.fixture(autouse=True)
def _calls():
    CALLS.clear()


def test_a_job_runs_its_steps_and_records_them(sync_jobs):
    job = submit("test.sleep", {"steps": 3, "seconds": 0})
    assert sync_jobs.drain() == [(job.pk, "success")]
    job = refresh(job)
    assert job.status == "success"
    assert [s["name"] for s in job.steps] == ["sleep 1", "sleep 2", "sleep 3"]
    assert job.progress == {"done": 3, "total": 3, "step": "sleep 3"}
    assert job.result == {"steps": 3, "slept": 0.0}
    assert job.started and job.ended and job.attempt == 1
    assert job.reason[-1][0] == "vclmgr:opcode:test.sleep"
    messages = list(job.log_entries.values_list("message", flat=True))
    assert messages[1].startswith("started on ") and messages[-1] == "success"
    assert "step 2/3 'sleep 2' done" in messages
    assert Event.objects.filter(topic=f"job.{job.pk}", kind="job.progress").count() == 3


def test_a_lost_worker_is_recovered_and_the_job_resumes_after_its_last_step(sync_jobs):
    job = submit("test.crashy")
    claim = dispatcher.claim_next()
    with pytest.raises(WorkerDied):
        runner.execute(claim.id, claim.token, time.monotonic() + 60)
    job = refresh(job)
    assert job.status == "running" and [s["name"] for s in job.steps] == ["one"]
    assert tasks.recover_expired() == 0  # the lease has not expired yet
    Job.objects.filter(pk=job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert tasks.recover_expired() == 1
    job = refresh(job)
    assert job.status == "queued"
    assert job.waiting_for == "retry 2 of 3 after a lost worker"
    assert "will resume after step 'one' (attempt 2 of 3)" in job.log_entries.last().message
    assert sync_jobs.drain() == [(job.pk, "success")]
    job = refresh(job)
    assert job.status == "success" and job.attempt == 2
    assert CALLS == ["one", "two", "three"]  # step one ran once


def test_a_job_fails_when_its_attempts_are_used_up(sync_jobs):
    services.set_queue_settings(actor="test", max_attempts=1)
    job = submit("test.crashy")
    claim = dispatcher.claim_next()
    with pytest.raises(WorkerDied):
        runner.execute(claim.id, claim.token, time.monotonic() + 60)
    Job.objects.filter(pk=job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    tasks.recover_expired()
    job = refresh(job)
    assert job.status == "error" and job.error_kind == "lost"
    assert "stopped renewing the lease" in job.error_message and "attempt 1 of 1; giving up" in job.error_message


def test_a_stale_runner_changes_nothing(sync_jobs):
    job = submit("test.sleep", {"steps": 2, "seconds": 0})
    claim = dispatcher.claim_next()
    Job.objects.filter(pk=job.pk).update(lease_token="someone-else")  # noqa: S106
    assert runner.execute(claim.id, claim.token, time.monotonic() + 60) == "stale"
    Job.objects.filter(pk=job.pk).update(lease_token=claim.token)
    real_record = runner.JobContext._record

    def steal_after_first(ctx, name, result):
        real_record(ctx, name, result)
        Job.objects.filter(pk=job.pk).update(lease_token="someone-else")  # noqa: S106

    runner.JobContext._record = steal_after_first
    try:
        assert runner.execute(claim.id, claim.token, time.monotonic() + 60) == "lost"
    finally:
        runner.JobContext._record = real_record
    job = refresh(job)
    assert job.status == "running" and len(job.steps) == 1


def test_a_running_job_is_canceled_between_steps(sync_jobs):
    job = submit("test.cancels_itself")
    assert sync_jobs.drain() == [(job.pk, "canceled")]
    job = refresh(job)
    assert job.status == "canceled" and job.error_message == "canceled after step 'one'"
    assert CALLS == []  # step two never ran


def test_a_job_hands_off_to_a_fresh_task_past_its_time_budget(sync_jobs):
    job = submit("test.sleep", {"steps": 3, "seconds": 0})
    claim = dispatcher.claim_next()
    assert runner.execute(claim.id, claim.token, time.monotonic() - 1) == "handoff"
    assert sync_jobs.handoffs == [(job.pk, claim.token)]
    assert len(refresh(job).steps) == 1  # it ran one step, then handed off
    assert refresh(job).lease_until > timezone.now() + timedelta(seconds=60)
    sync_jobs.drain()
    assert refresh(job).status == "success"


def test_an_opcode_error_fails_the_job_with_its_message(sync_jobs):
    job = submit("test.fail", {"message": "disk on fire", "after_steps": 1})
    sync_jobs.drain()
    job = refresh(job)
    assert (job.status, job.error_kind, job.error_message) == ("error", "exception", "Failure: disk on fire")
    assert job.log_entries.filter(level="debug", message__contains="Traceback").exists()
    bad = submit("test.bad_result")
    sync_jobs.drain()
    assert "not JSON-serializable" in refresh(bad).error_message


def test_an_opcode_that_vanished_fails_clearly(sync_jobs):
    job = submit()
    Job.objects.filter(pk=job.pk).update(opcode="gone.away")
    sync_jobs.drain()
    job = refresh(job)
    assert job.error_kind == "invalid" and "unknown opcode 'gone.away'" in job.error_message


def test_expansion_succeeds_when_all_children_succeed(sync_jobs, admin_user):
    parent = services.submit(
        "test.expand",
        {"children": [{"opcode": "noop"}, {"opcode": "test.sleep", "params": {"seconds": 0}}]},
        actor=admin_user,
        reason="rate-limit:5:evacuate node 3",
    )
    sync_jobs.drain()
    parent = refresh(parent)
    children = list(parent.children.order_by("id"))
    assert parent.status == "success"
    assert parent.result == {
        "result": {"children": 2},
        "children": {"success": [c.pk for c in children], "error": [], "canceled": []},
    }
    for child in children:
        assert child.status == "success" and child.submitter == admin_user
        assert child.buckets == [["rate-limit:5:evacuate node 3", 5]]  # inherited with the trail
        assert child.reason[: len(parent.reason)] == parent.reason  # the parent's whole trail, then:
        assert child.reason[len(parent.reason)][0] == f"vclmgr:expand:job {parent.pk}"


def test_expansion_fails_with_a_summary_and_a_parent_waits_meanwhile(sync_jobs, admin_user):
    parent = services.submit(
        "test.expand",
        {"children": [{"opcode": "test.fail", "params": {"message": "nope"}}, {"opcode": "noop"}]},
        actor=admin_user,
    )
    sync_jobs.run_one()  # the parent: submits its children, then waits for them
    parent = refresh(parent)
    assert parent.status == "waiting" and parent.awaiting_children
    assert parent.waiting_for.startswith("children:")
    sync_jobs.drain()
    parent = refresh(parent)
    failed = parent.children.get(opcode="test.fail")
    assert parent.status == "error" and parent.error_kind == "children"
    assert parent.error_message == f"1 of 2 child jobs did not succeed: job {failed.pk} error (Failure: nope)"


def test_resubmitting_children_on_a_retried_attempt_is_idempotent(sync_jobs, admin_user):
    parent = services.submit("test.expand", {"children": [{"opcode": "noop"}]}, actor=admin_user)
    claim = dispatcher.claim_next()
    lease = runner.Lease(parent.pk, claim.token, claim.job.attempt, 30)
    ctx = runner.JobContext(refresh(parent), lease, time.monotonic() + 60)
    first = ctx.submit_child("noop", {})
    again = runner.JobContext(refresh(parent), lease, time.monotonic() + 60).submit_child("noop", {})
    assert first == again
    assert Job.objects.filter(parent=parent).count() == 1


def test_sequential_children_and_canceling_a_parent_cancels_them(sync_jobs, admin_user):
    parent = services.submit(
        "test.expand",
        {"children": [{"opcode": "test.sleep", "params": {"seconds": 0}}] * 3, "sequential": True},
        actor=admin_user,
    )
    sync_jobs.run_one()
    children = list(Job.objects.filter(parent=parent).order_by("id"))
    assert [c.depends for c in children[1:]] == [[[children[0].pk, []]], [[children[1].pk, []]]]
    services.cancel(refresh(parent), actor=admin_user)
    assert refresh(parent).status == "canceled"
    assert {refresh(c).status for c in children} == {"canceled"}


def test_cluster_verify_reports_problems(sync_jobs, admin_user):
    tasks.ensure_schedule()
    ok = services.submit("cluster.verify", {}, actor=admin_user)
    sync_jobs.drain()
    assert refresh(ok).status == "success", refresh(ok).error_message
    stuck = submit()
    Job.objects.filter(pk=stuck.pk).update(status="waiting", awaiting_children=True)
    bad = services.submit("cluster.verify", {}, actor=admin_user)
    sync_jobs.drain()
    bad = refresh(bad)
    assert bad.status == "error" and "parents wait for children that all ended" in bad.error_message


def test_jobs_archive_opcode(sync_jobs, admin_user):
    old = submit()
    sync_jobs.drain()
    Job.objects.filter(pk=old.pk).update(ended=timezone.now() - timedelta(days=3))
    job = services.submit("jobs.archive", {"older_than_days": 2}, actor=admin_user)
    sync_jobs.drain()
    assert refresh(job).result == {"archived": 1}
    assert refresh(old).archived


def test_sweep_completes_stuck_parents_and_wakes_workers(sync_jobs):
    parent = submit()
    Job.objects.filter(pk=parent.pk).update(status="waiting", awaiting_children=True, result={"result": 1})
    submit()
    before = sync_jobs.kicks
    assert tasks.sweep() == {"recovered": 0, "parents": 1, "woken": 1}
    assert refresh(parent).status == "success"
    assert sync_jobs.kicks == before + 1


def test_the_schedule_is_created_once():
    tasks.ensure_schedule()
    tasks.ensure_schedule()
    from django_q.models import Schedule

    assert Schedule.objects.filter(name=tasks.SWEEP_SCHEDULE).count() == 1


def test_job_topics_are_for_the_submitter_and_staff(alice, bob, admin_user):
    job = services.submit("noop", {}, actor=alice)
    assert topics.may_subscribe(alice, f"job.{job.pk}")
    assert topics.may_subscribe(admin_user, f"job.{job.pk}")
    assert not topics.may_subscribe(bob, f"job.{job.pk}")
    assert not topics.may_subscribe(alice, "job.abc")
    assert not topics.may_subscribe(alice, "job.99999999999999999999")
