"""Built-in opcodes: generic ones (``cluster.verify``, ``jobs.archive``) and ones for tests,
demos and benchmarks (``noop``, ``test.sleep``, ``test.fail``, ``test.expand``).

Opcodes that touch hypervisors (``vm.create``, ``node.evacuate`` …) live with their apps
and register the same way (``<app>/opcodes.py`` is imported at start).
"""

import time
from collections.abc import Callable
from datetime import timedelta

from django.db.models import Count, Q
from django.utils import timezone
from rest_framework import serializers

from core.hooks import Hook
from jobs import services
from jobs.locks import EXCLUSIVE, SHARED
from jobs.models import Gauge, Job, JobDependency, QueueSettings
from jobs.registry import StringListField, opcode, registered

S = Job.Status


@opcode("noop", staff_only=False)
def noop(job):
    """Do nothing (tests and benchmarks)."""
    return {}


class SleepParams(serializers.Serializer):
    steps = serializers.IntegerField(min_value=1, max_value=1000, default=1)
    seconds = serializers.FloatField(min_value=0, max_value=60, default=1.0)
    locks = StringListField(default=list, max_length=20, help_text="Locks taken exclusive, like vm:7")
    shared_locks = StringListField(default=list, max_length=20, help_text="Locks taken shared")
    gauge = serializers.CharField(required=False, max_length=100, help_text="Count running steps in this Gauge")


def _sleep_locks(params):
    return [(name, EXCLUSIVE) for name in params["locks"]] + [(name, SHARED) for name in params["shared_locks"]]


def _sleep(seconds, gauge=""):
    if gauge:
        Gauge.enter(gauge)
    try:
        time.sleep(seconds)
    finally:
        if gauge:
            Gauge.leave(gauge)
    return seconds


@opcode("test.sleep", params=SleepParams, locks=_sleep_locks)
def test_sleep(job):
    """Sleep in steps (tests and demos); optionally holding locks."""
    steps, seconds = job.params["steps"], job.params["seconds"]
    job.expect(steps)
    for number in range(1, steps + 1):
        job.step(f"sleep {number}", _sleep, seconds, job.params.get("gauge", ""))
    return {"steps": steps, "slept": steps * seconds}


class FailParams(serializers.Serializer):
    message = serializers.CharField(max_length=500, default="failed on purpose")
    after_steps = serializers.IntegerField(min_value=0, max_value=100, default=0)
    seconds = serializers.FloatField(min_value=0, max_value=60, default=0)


class Failure(Exception):
    pass


@opcode("test.fail", params=FailParams)
def test_fail(job):
    """Fail on purpose, after some sleeping steps (tests)."""
    for number in range(1, job.params["after_steps"] + 1):
        job.step(f"sleep {number}", _sleep, job.params["seconds"])
    raise Failure(job.params["message"])


class ChildSpec(serializers.Serializer):
    opcode = serializers.CharField(max_length=64)
    params = serializers.DictField(required=False, default=dict)
    reason = serializers.CharField(max_length=1000, required=False)

    def validate_opcode(self, value):
        if not registered(value):
            raise serializers.ValidationError(f"unknown opcode {value!r}")
        return value


class ExpandParams(serializers.Serializer):
    children = ChildSpec(many=True, min_length=1, max_length=100)
    sequential = serializers.BooleanField(default=False, help_text="Each child depends on the previous one.")


@opcode("test.expand", params=ExpandParams)
def test_expand(job):
    """Expand into child jobs (tests and demos of expansion)."""
    previous = None
    for spec in job.params["children"]:
        depends = [[previous, []]] if job.params["sequential"] and previous else []
        previous = job.submit_child(spec["opcode"], spec.get("params"), reason=spec.get("reason"), depends=depends)
    return {"children": len(job.params["children"])}


class VerifyParams(serializers.Serializer):
    stale_minutes = serializers.IntegerField(min_value=1, max_value=10080, default=60)


def _verify_jobs(stale_minutes):
    now = timezone.now()
    problems = []
    expired = Job.objects.filter(status=S.RUNNING, lease_until__lt=now).count()
    if expired:
        problems.append(f"{expired} running jobs have an expired lease (the janitor should recover them)")
    unleased = Job.objects.filter(status=S.RUNNING, lease_until__isnull=True).count()
    if unleased:
        problems.append(f"{unleased} running jobs have no lease")
    stuck_parents = (
        Job.objects.filter(status=S.WAITING, awaiting_children=True)
        .annotate(open=Count("children", filter=~Q(children__status__in=Job.FINAL)))
        .filter(open=0)
        .count()
    )
    if stuck_parents:
        problems.append(f"{stuck_parents} parents wait for children that all ended")
    doomed = 0
    for dep in JobDependency.objects.filter(job__status__in=Job.PENDING, on__status__in=Job.FINAL).select_related("on"):
        if dep.accepted and dep.on.status not in dep.accepted:
            doomed += 1
    if doomed:
        problems.append(f"{doomed} pending jobs depend on a job that ended in a status they do not accept")
    stale = Job.objects.filter(status=S.QUEUED, received__lt=now - timedelta(minutes=stale_minutes)).count()
    if stale:
        problems.append(f"{stale} jobs queued for more than {stale_minutes} minutes")
    return {"problems": problems, "expired_leases": expired, "stuck_parents": stuck_parents}


def _verify_queue():
    from jobs.tasks import SWEEP_SCHEDULE, schedule_exists
    from jobs.wake import queue_size

    problems = []
    if not schedule_exists():
        problems.append(f"the periodic sweep schedule {SWEEP_SCHEDULE!r} is missing (a worker restores it)")
    state = services.queue_state(QueueSettings.get())
    return {"problems": problems, "broker_queue": queue_size(), **state}


class VerifyFailed(Exception):
    pass


# Checks other apps add (name -> fn(job) returning {"problems": [...], ...}): the jobs layer may
# not import them, so they register themselves (the VM app's hypervisor check, in its ready()).
VERIFY_CHECKS: Hook[Callable[..., dict]] = Hook("jobs.opcodes.VERIFY_CHECKS", keyed=True, single=True)


@opcode("cluster.verify", params=VerifyParams, locks=lambda p: [("cluster", SHARED)])
def cluster_verify(job):
    """Check the cluster's bookkeeping (jobs and queue) and every registered check (hypervisors)."""
    checks = {
        "jobs": job.step("jobs", _verify_jobs, job.params["stale_minutes"]),
        "queue": job.step("queue", _verify_queue),
    }
    for name, check in VERIFY_CHECKS.items():
        checks[name] = job.step(name, check, job)
    problems = [p for check in checks.values() for p in check["problems"]]
    for problem in problems:
        job.log(problem, "warning")
    if problems:
        raise VerifyFailed(f"{len(problems)} problems found: " + "; ".join(problems))
    job.log("no problems found")
    return checks


class ArchiveParams(serializers.Serializer):
    older_than_days = serializers.IntegerField(min_value=0, max_value=36500, default=30)


@opcode("jobs.archive", params=ArchiveParams)
def jobs_archive(job):
    """Archive finished jobs older than N days."""
    days = job.params["older_than_days"]
    count = job.step("archive", lambda: services.archive(days, actor=job.actor, reason=f"job {job.job_id}"))
    job.log(f"archived {count} jobs that ended more than {days} days ago")
    return {"archived": count}
