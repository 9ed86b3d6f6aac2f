"""One user's backlog delays nobody: jobs waiting for a dependency never hide a
job that could start, submitters take turns within a priority, and a user's own queued and
waiting jobs are capped."""

import pytest
from django.test import override_settings

from jobs import dispatcher, services
from jobs.models import Job
from tests.jobs.helpers import refresh, submit, wait_until

BACKLOG = 600  # more than the dispatcher's SCAN_LIMIT


def _long_running_job():
    long = submit("test.sleep", {"steps": 1, "seconds": 60})
    claim = dispatcher.claim_next()
    assert claim is not None and claim.id == long.pk
    return long


def _backlog_on(job, count=BACKLOG):
    return services.submit_batch([{"opcode": "noop", "depends": [job.pk]} for _ in range(count)], actor="test")


def test_it_starts_a_runnable_job_behind_600_waiting_ones(sync_jobs, bob):
    assert BACKLOG > dispatcher.SCAN_LIMIT
    long = _long_running_job()
    _backlog_on(long)
    later = submit("noop", actor=bob)
    claim = dispatcher.claim_next()
    assert claim is not None and claim.id == later.pk
    assert Job.objects.filter(status="waiting").count() == BACKLOG


def test_waiting_jobs_become_runnable_when_their_dependency_ends(db, sync_jobs):
    first = submit("noop")
    waiting = submit("noop", depends=[first.pk])
    assert [job.pk for job in dispatcher.runnable()] == [first.pk]
    sync_jobs.drain()
    assert refresh(first).status == refresh(waiting).status == "success"


def test_a_dependency_that_failed_still_fails_its_dependents(db, sync_jobs):
    first = submit("test.fail")
    waiting = submit("noop", depends=[first.pk])
    sync_jobs.drain()
    assert refresh(waiting).status == "error" and refresh(waiting).error_kind == "dependency"


def test_submitters_take_turns_within_a_priority(db, alice, bob, admin_user):
    mine = [submit("noop", actor=alice) for _ in range(4)]
    theirs = [submit("noop", actor=bob) for _ in range(2)]
    urgent = submit("noop", actor=admin_user, priority=5)
    order = list(dispatcher.runnable().values_list("id", flat=True))
    assert order == [urgent.pk, mine[0].pk, theirs[0].pk, mine[1].pk, theirs[1].pk, mine[2].pk, mine[3].pk]


@override_settings(VCLMGR_JOBS_MAX_PENDING_PER_USER=5)
def test_it_refuses_a_users_backlog_past_the_cap(api, alice, bob, sync_jobs):
    response = api(alice).post("/api/v1/jobs/batch/", {"jobs": [{"opcode": "noop"}] * 6}, format="json")
    assert response.status_code == 400, response.json()
    assert "at most 5 at once" in response.json()["error"]["message"]
    assert Job.objects.count() == 0
    assert api(alice).post("/api/v1/jobs/batch/", {"jobs": [{"opcode": "noop"}] * 5}, format="json").status_code == 202
    assert api(alice).post("/api/v1/jobs/", {"opcode": "noop"}, format="json").status_code == 400
    assert api(bob).post("/api/v1/jobs/", {"opcode": "noop"}, format="json").status_code == 202  # others unaffected
    sync_jobs.drain()
    assert api(alice).post("/api/v1/jobs/", {"opcode": "noop"}, format="json").status_code == 202  # room again


def test_services_acting_for_a_user_are_not_capped(db, alice):
    with override_settings(VCLMGR_JOBS_MAX_PENDING_PER_USER=1):
        services.submit_batch([{"opcode": "noop"}] * 3, actor="test", submitter=alice)
    assert Job.objects.filter(submitter=alice).count() == 3


@pytest.mark.slow
def test_real_workers_run_a_later_job_behind_a_600_job_backlog(start_workers, bob):
    child = start_workers(2)
    long = submit("test.sleep", {"steps": 1, "seconds": 60})
    wait_until(lambda: refresh(long).status == "running", 30, "the long job to start", child)
    _backlog_on(long)
    later = submit("noop", actor=bob)
    wait_until(lambda: refresh(later).status == "success", 30, "the later job to run", child)
    assert refresh(long).status == "running"


@override_settings(VCLMGR_JOBS_MAX_PENDING_PER_USER=2)
def test_retrying_one_canceled_job_again_and_again_is_capped_too(api, alice, sync_jobs):
    failed = services.cancel(services.submit("noop", {}, actor=alice), actor=alice)
    codes = [api(alice).post(f"/api/v1/jobs/{failed.pk}/retry/").status_code for _ in range(3)]
    assert codes == [202, 202, 400]
