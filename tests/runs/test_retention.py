"""Retention: an ended run's output and files go after RUNS_RETENTION_DAYS; its row stays."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import services, tasks
from runs.models import Run
from tests.runs.helpers import fresh, submit

pytestmark = pytest.mark.django_db


def _ran(alice, sync_jobs, profile, ended_days_ago):
    profile(output="done\n", exit_status=0, files={"out/report.xml": "<ok/>"})
    run = submit(alice, inputs={"in.txt": b"hello"}, artifacts=["out/*.xml"])
    sync_jobs.drain()
    Run.objects.filter(pk=run.pk).update(ended=timezone.now() - timedelta(days=ended_days_ago))
    return fresh(run)


def _on_disk(run):
    return [f.stored for f in run.files.all() if services.storage().exists(f.stored)]


def test_an_old_runs_files_go_and_a_recent_runs_stay(settings, sim_host, image, alice, profile, sync_jobs, client):
    settings.RUNS_RETENTION_DAYS = 30
    old = _ran(alice, sync_jobs, profile, 31)
    recent = _ran(alice, sync_jobs, profile, 29)
    old_names = _on_disk(old)
    assert len(old_names) == 2 and len(_on_disk(recent)) == 2
    assert tasks.housekeeping()["files_removed"] == 1
    old, recent = fresh(old), fresh(recent)
    assert not any(services.storage().exists(name) for name in old_names)
    assert old.files_removed and not old.files.exists() and not old.output.exists()
    assert old.state == "success" and old.exit_status == 0  # the row and its facts stay
    assert "removed by retention" in old.reason[-1][1]
    assert len(_on_disk(recent)) == 2 and recent.output.exists() and recent.files_removed is None
    assert tasks.housekeeping()["files_removed"] == 0  # done once

    client.force_login(alice)
    body = client.get(f"/api/v1/runs/{old.pk}/").json()
    assert body["files_removed"] and body["state"] == "success"
    log = client.get(f"/api/v1/runs/{old.pk}/log/").json()
    assert log["chunks"] == [] and "removed by retention" in log["note"]
    assert client.get(f"/api/v1/runs/{old.pk}/artifacts/").json() == []
    assert client.get(f"/api/v1/runs/{old.pk}/artifacts/1/").status_code == 410
    page = client.get(f"/runs/{old.pk}/").content.decode()
    assert "removed by retention" in page


def test_zero_keeps_files_for_ever(settings, sim_host, image, alice, profile, sync_jobs):
    settings.RUNS_RETENTION_DAYS = 0
    old = _ran(alice, sync_jobs, profile, 3650)
    assert tasks.housekeeping()["files_removed"] == 0
    assert len(_on_disk(old)) == 2 and fresh(old).files_removed is None


def test_an_unended_run_is_never_expired(settings, sim_host, image, alice):
    settings.RUNS_RETENTION_DAYS = 1
    run = submit(alice, inputs={"in.txt": b"hello"})
    Run.objects.filter(pk=run.pk).update(created=timezone.now() - timedelta(days=5))
    assert services.expire_files(actor="test") == 0
    assert len(_on_disk(run)) == 1


def test_the_worker_start_makes_the_schedule(db):
    from django_q.models import Schedule

    tasks.on_worker_start()
    tasks.on_worker_start()
    assert Schedule.objects.filter(name=tasks.SCHEDULE, func=tasks.FUNC).count() == 1
