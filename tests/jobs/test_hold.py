"""Holding a pending job in a bucket of its own (Ganeti's job filter PAUSE and RATE_LIMIT)."""

import pytest

from jobs import dispatcher, services
from jobs.models import Job

pytestmark = pytest.mark.django_db


def test_a_job_held_at_zero_stays_queued_until_released(admin_user, sync_jobs):
    job = services.submit("noop", {}, actor=admin_user)
    assert services.hold(job, "filter:x", 0, actor=admin_user, reason="pause") is True
    assert sync_jobs.drain() == [] and Job.objects.get(pk=job.pk).status == "queued"
    assert [held.pk for held in services.release("filter:x", actor=admin_user, reason="go")] == [job.pk]
    assert Job.objects.get(pk=job.pk).buckets == []
    assert [job_id for job_id, _ in sync_jobs.drain()] == [job.pk]
    assert Job.objects.get(pk=job.pk).status == "success"


def test_a_held_bucket_limits_how_many_run_and_only_pending_jobs_are_held(admin_user, sync_jobs):
    first, second = (services.submit("noop", {}, actor=admin_user) for _ in range(2))
    for job in (first, second):
        services.hold(job, "filter:y", 1, actor=admin_user, reason="rate")
    assert dispatcher.claim_next().id == first.pk and dispatcher.claim_next() is None
    done = services.submit("noop", {}, actor=admin_user)
    services.cancel(done, actor=admin_user)
    assert services.hold(done, "filter:y", 0, actor=admin_user, reason="too late") is False
    assert services.release("filter:nothing", actor=admin_user, reason="none") == []
