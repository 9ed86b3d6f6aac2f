"""Job verbs: submit (and every bad input), cancel, retry, archive, queue settings."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework import serializers

from core.models import Event, ObjectChange
from jobs import dispatcher, services
from jobs.models import Job, JobLog, QueueSettings
from tests.jobs.helpers import refresh, submit

pytestmark = pytest.mark.django_db


def errors_of(call):
    with pytest.raises(serializers.ValidationError) as caught:
        call()
    return caught.value.detail


def test_submit_queues_a_job_with_its_trail_log_events_and_change_log(sync_jobs, alice):
    job = services.submit("test.sleep", {"steps": 2}, actor=alice, reason="rate-limit:3:maint", source="api:alice")
    assert job.status == "queued"
    assert job.submitter == alice
    assert job.params == {"steps": 2, "seconds": 1.0, "locks": [], "shared_locks": []}
    assert [entry[:2] for entry in job.reason] == [
        ["api:alice", "rate-limit:3:maint"],
        ["vclmgr:submit", "submitted by alice"],
    ]
    assert job.buckets == [["rate-limit:3:maint", 3]]
    assert JobLog.objects.filter(job=job, message__contains="queued by alice").exists()
    topics = set(Event.objects.filter(kind="job.status").values_list("topic", flat=True))
    assert topics == {f"job.{job.pk}", f"user.{alice.pk}", "admin"}
    assert set(Event.objects.filter(kind="job.log").values_list("topic", flat=True)) == topics
    assert ObjectChange.objects.filter(object_id=str(job.pk), action="create", actor="alice").exists()


def test_submit_takes_the_opcodes_locks(sync_jobs):
    job = submit("test.sleep", {"locks": "vm:7,vm:8", "shared_locks": ["hypervisor:2"]})
    assert job.locks == [
        ["cluster", "shared"],
        ["hypervisor:2", "shared"],
        ["vm:7", "exclusive"],
        ["vm:8", "exclusive"],
    ]


@pytest.mark.parametrize(
    "kwargs, field, message",
    [
        ({"opcode": "vm.teleport"}, "opcode", "unknown opcode 'vm.teleport'"),
        ({"params": {"steps": 0}}, "params", "greater than or equal to 1"),
        ({"params": {"steps": "many"}}, "params", "valid integer"),
        ({"params": {"color": "red"}}, "params", "unknown parameter"),
        ({"params": {"locks": ["VM 7"]}}, "params", "bad lock name"),
        ({"reason": "rate-limit:x:maint"}, "reason", "malformed rate-limit reason"),
        ({"reason": "rate-limit:0:maint"}, "reason", "N must be between"),
        ({"reason": "rate-limit:3:"}, "reason", "label"),
        ({"priority": 21}, "priority", "between -20 and 20"),
        ({"priority": "high"}, "priority", "whole number"),
        ({"depends": [999999]}, "depends", "job 999999 does not exist"),
        ({"depends": [[1, ["finished"]]]}, "depends", "accepted statuses"),
        ({"depends": ["abc"]}, "depends", "a job id"),
        ({"depends": [0]}, "depends", "a job id"),
    ],
)
def test_it_refuses_bad_input_per_field_and_queues_nothing(sync_jobs, kwargs, field, message):
    spec = {"opcode": "test.sleep", "params": {}, **kwargs}
    before = Job.objects.count()
    detail = errors_of(
        lambda: services.submit(
            spec["opcode"],
            spec["params"],
            actor="test",
            reason=spec.get("reason"),
            priority=spec.get("priority", 0),
            depends=spec.get("depends", ()),
        )
    )
    assert field in detail
    assert message in str(detail[field])
    assert Job.objects.count() == before
    assert sync_jobs.kicks == 0


def test_params_errors_name_each_field(sync_jobs):
    detail = errors_of(lambda: submit("test.sleep", {"steps": 0, "seconds": -1, "bogus": 1}))
    assert set(detail["params"]) == {"steps", "seconds", "bogus"}


def test_a_dependency_listed_twice_is_refused(sync_jobs):
    first = submit()
    detail = errors_of(lambda: submit(depends=[first.pk, [first.pk, []]]))
    assert "listed twice" in str(detail["depends"])


def test_dependencies_make_a_job_wait_and_default_to_success(sync_jobs):
    first = submit("test.sleep", {"seconds": 0})
    second = submit(depends=[first.pk])
    any_end = submit(depends=[[first.pk, []]])
    assert second.status == "waiting"
    assert second.waiting_for == f"dependency: job {first.pk}"
    assert second.depends == [[first.pk, ["success"]]]
    assert any_end.depends == [[first.pk, []]]


def test_a_dependency_that_already_ended_otherwise_fails_the_job_at_once(sync_jobs):
    failed = submit("test.fail")
    sync_jobs.drain()
    job = refresh(submit(depends=[failed.pk]))
    assert job.status == "error"
    assert job.error_kind == "dependency"
    assert job.error_message == f"dependency job {failed.pk} ended error; accepted: success"


def test_a_batch_resolves_names_in_any_order_and_refuses_cycles(sync_jobs):
    jobs = services.submit_batch(
        [
            {"opcode": "noop", "name": "last", "depends": ["@first", "@middle"]},
            {"opcode": "noop", "name": "first"},
            {"opcode": "noop", "name": "middle", "depends": [["@first", ["success", "error"]]]},
        ],
        actor="test",
    )
    last, first, middle = jobs
    assert last.depends == [[first.pk, ["success"]], [middle.pk, ["success"]]]
    assert middle.depends == [[first.pk, ["error", "success"]]]
    before = Job.objects.count()
    detail = errors_of(
        lambda: services.submit_batch(
            [
                {"opcode": "noop", "name": "a", "depends": ["@b"]},
                {"opcode": "noop", "name": "b", "depends": ["@c"]},
                {"opcode": "noop", "name": "c", "depends": ["@a"]},
            ],
            actor="test",
        )
    )
    assert "dependency cycle: a → b → c → a" in str(detail["depends"])
    assert Job.objects.count() == before


def test_a_batch_refuses_unknown_names_and_reports_each_bad_job(sync_jobs):
    detail = errors_of(
        lambda: services.submit_batch(
            [{"opcode": "noop", "depends": ["@ghost"]}, {"opcode": "nope"}, {"opcode": "noop"}], actor="test"
        )
    )
    assert "opcode" in detail["jobs"][1]
    detail = errors_of(lambda: services.submit_batch([{"opcode": "noop", "depends": ["@ghost"]}], actor="test"))
    assert "no job named @ghost" in str(detail)


def test_a_child_may_not_depend_on_its_parent_or_what_waits_for_it(sync_jobs):
    parent = submit("test.sleep", {"seconds": 0})
    waits_for_parent = submit(depends=[[parent.pk, []]])
    with pytest.raises(serializers.ValidationError, match="parent"):
        services.submit("noop", {}, actor="test", parent=parent, depends=[parent.pk])
    with pytest.raises(serializers.ValidationError, match="dependency cycle"):
        services.submit("noop", {}, actor="test", parent=parent, depends=[waits_for_parent.pk])


def test_cancel_of_a_queued_job_is_immediate_and_fails_strict_dependents(sync_jobs, admin_user):
    job = submit("test.sleep", {"seconds": 0})
    strict = submit(depends=[job.pk])
    lenient = submit(depends=[[job.pk, ["canceled"]]])
    services.cancel(job, actor=admin_user, reason="not needed")
    job = refresh(job)
    assert job.status == "canceled"
    assert job.error_message == "canceled by admin: not needed"
    assert refresh(strict).status == "error"
    assert refresh(lenient).status == "waiting"
    sync_jobs.drain()
    assert refresh(lenient).status == "success"
    with pytest.raises(services.Conflict, match="already ended"):
        services.cancel(job, actor=admin_user)


def test_cancel_of_a_running_job_is_a_request(sync_jobs):
    job = submit("test.sleep", {"seconds": 0})
    claim = dispatcher.claim_next()
    assert claim.id == job.pk
    job = services.cancel(refresh(job), actor="cli")
    assert job.status == "running" and job.cancel_requested
    with pytest.raises(services.Conflict, match="already being canceled"):
        services.cancel(job, actor="cli")


def test_retry_submits_a_new_linked_job_with_the_trail(sync_jobs, alice):
    failed = services.submit("test.fail", {"message": "boom"}, actor=alice)
    sync_jobs.drain()
    with pytest.raises(services.Conflict):
        services.retry(submit(), actor=alice)
    new = services.retry(refresh(failed), actor=alice, reason="try again")
    assert new.retry_of_id == failed.pk
    assert new.submitter == alice
    assert new.params == refresh(failed).params
    assert ["vclmgr:retry", f"retry of job {failed.pk}: try again"] in [e[:2] for e in new.reason]
    assert JobLog.objects.filter(job=failed, message__contains=f"retried as job {new.pk}").exists()


def test_archive_hides_old_finished_jobs(sync_jobs):
    old, recent, running = submit(), submit(), submit("test.sleep")
    sync_jobs.drain()  # test.sleep sleeps 1 s
    Job.objects.filter(pk=old.pk).update(ended=timezone.now() - timedelta(days=40))
    Job.objects.filter(pk=running.pk).update(status="running", ended=None)
    assert services.archive(30, actor="cli") == 1
    assert list(Job.objects.filter(archived=True).values_list("pk", flat=True)) == [old.pk]
    assert not refresh(recent).archived
    with pytest.raises(serializers.ValidationError):
        services.archive(-1, actor="cli")


@pytest.mark.parametrize(
    "value, message",
    [(0, "between 1"), ("abc", "whole number"), (1.5, "whole number"), (10**6, "between 1"), (True, "whole number")],
)
def test_queue_limit_must_be_a_positive_whole_number(value, message):
    detail = errors_of(lambda: services.set_queue_settings(actor="cli", limit=value))
    assert message in str(detail["limit"])
    assert QueueSettings.get().limit == 20


def test_queue_settings_change_is_logged_and_emitted(admin_user):
    services.set_queue_settings(actor=admin_user, limit="5", lease_seconds=10, reason="maintenance")
    row = QueueSettings.get()
    assert (row.limit, row.lease_seconds, row.max_attempts) == (5, 10, 3)
    change = ObjectChange.objects.get(action="update", object_id="1")
    assert change.changes == {"limit": [20, 5], "lease_seconds": [30, 10]}
    assert change.reason == "maintenance"
    assert Event.objects.filter(kind="queue.settings", topic="admin").exists()


def test_queue_state_counts_and_buckets(sync_jobs):
    submit("test.sleep", reason="rate-limit:2:maint")
    submit(depends=[submit().pk])
    dispatcher.claim_next()
    state = services.queue_state()
    assert state["running"] == 1 and state["queued"] == 1 and state["waiting"] == 1
    assert state["buckets"] == [{"reason": "rate-limit:2:maint", "label": "maint", "size": 2, "running": 1}]


def test_visibility(alice, bob, admin_user):
    mine = services.submit("noop", {}, actor=alice)
    services.submit("noop", {}, actor=bob)
    assert list(services.visible_to(alice)) == [mine]
    assert services.visible_to(admin_user).count() == 2
    assert services.may_act_on(alice, mine) and not services.may_act_on(bob, mine)
