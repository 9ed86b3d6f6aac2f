"""``manage.py job …`` and ``manage.py queue``."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from jobs import services
from jobs.models import Job, QueueSettings
from tests.jobs.helpers import refresh, submit

pytestmark = pytest.mark.django_db


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_submit_with_params_reason_depends_and_priority(sync_jobs, alice):
    first = submit()
    out = run(
        "job",
        "submit",
        "test.sleep",
        "--param",
        "steps=3",
        "--param",
        "locks=vm:1,vm:2",
        "--reason",
        "rate-limit:7:maintenance 123",
        "--depends",
        f"{first.pk}:success,error",
        "--priority",
        "4",
        "--user",
        "alice",
    )
    job = Job.objects.latest("id")
    assert out.strip() == f"job {job.pk} submitted (waiting)"
    assert job.params["steps"] == 3 and job.params["locks"] == ["vm:1", "vm:2"]
    assert job.priority == 4 and job.submitter == alice
    assert job.depends == [[first.pk, ["error", "success"]]]
    assert job.reason[0][:2] == ["cli:job submit", "rate-limit:7:maintenance 123"]
    assert job.reason[1][1] == "submitted by cli"


def test_submit_any_and_default_dependencies(sync_jobs):
    first = submit()
    run("job", "submit", "noop", "--depends", f"{first.pk}:any", "--depends", str(submit().pk))
    assert Job.objects.latest("id").depends[0] == [first.pk, []]
    assert Job.objects.latest("id").depends[1][1] == ["success"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope"], "opcode: unknown opcode 'nope'"),
        (["test.sleep", "--param", "steps=0"], "params.steps:"),
        (["test.sleep", "--param", "nonsense"], "expected name=value"),
        (["noop", "--reason", "rate-limit:x:y"], "reason: malformed rate-limit reason"),
        (["noop", "--depends", "abc"], "expected a job id"),
        (["noop", "--depends", "424242"], "depends: job 424242 does not exist"),
        (["noop", "--depends", "1:done"], "depends:"),
        (["noop", "--user", "ghost"], "no such user"),
    ],
)
def test_submit_refuses_bad_input(sync_jobs, args, message):
    if args[-1] == "1:done":
        args = ["noop", "--depends", f"{submit().pk}:done"]
    before = Job.objects.count()
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        run("job", "submit", *args)
    assert Job.objects.count() == before


def test_list_info_cancel_retry_watch(sync_jobs):
    sleeper = submit("test.sleep")
    failed = submit("test.fail", {"message": "kaput"})
    assert "test.sleep" in run("job", "list")
    run("job", "cancel", str(sleeper.pk), "--reason", "enough")
    assert refresh(sleeper).status == "canceled"
    with pytest.raises(CommandError, match="already ended"):
        run("job", "cancel", str(sleeper.pk))
    sync_jobs.drain()
    listed = json.loads(run("job", "list", "--status", "error", "--json"))
    assert [row["id"] for row in listed] == [failed.pk]
    info = run("job", "info", str(failed.pk))
    assert "Failure: kaput" in info and "reason trail:" in info and "started on" in info
    assert json.loads(run("job", "info", str(failed.pk), "--json"))["error_kind"] == "exception"
    with pytest.raises(CommandError, match="ended error"):
        run("job", "watch", str(failed.pk))
    out = run("job", "retry", str(sleeper.pk))
    new = Job.objects.latest("id")
    assert out.strip() == f"job {sleeper.pk} retried as job {new.pk} (queued)" and new.retry_of_id == sleeper.pk
    sync_jobs.drain()
    watched = run("job", "watch", str(new.pk))
    assert "step 1/1 'sleep 1' done" in watched and watched.strip().endswith(f"job {new.pk} success")
    with pytest.raises(CommandError, match="job 999999 does not exist"):
        run("job", "info", "999999")


def test_cancel_of_a_running_job_says_it_stops_after_the_step(sync_jobs):
    from jobs import dispatcher

    job = submit("test.sleep")
    dispatcher.claim_next()
    assert "cancel requested" in run("job", "cancel", str(job.pk))


def test_archive(sync_jobs):
    assert run("job", "archive", "--older-than", "0").strip() == "archived 0 jobs that ended more than 0 days ago"
    with pytest.raises(CommandError, match="older_than_days"):
        run("job", "archive", "--older-than", "-3")


def test_queue_shows_and_tunes(sync_jobs):
    services.submit("test.sleep", {}, actor="t", reason="rate-limit:2:maint")
    from jobs import dispatcher

    dispatcher.claim_next()
    out = run("queue")
    assert "limit 20" in out and "running 1" in out and "bucket 'maint': 1 of 2 running" in out
    assert "limit 5" in run("queue", "--limit", "5", "--reason", "night")
    assert QueueSettings.get().limit == 5
    for bad, message in [("0", "between 1 and 10000"), ("abc", "whole number"), ("2.5", "whole number")]:
        with pytest.raises(CommandError, match=f"limit: must be .*{message}"):
            run("queue", "--limit", bad)
    assert QueueSettings.get().limit == 5
    assert json.loads(run("queue", "--json", "--lease", "10"))["lease_seconds"] == 10
