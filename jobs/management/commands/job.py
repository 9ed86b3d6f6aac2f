"""``manage.py job …``: jobs from the command line, like Ganeti's ``gnt-job``.

job list [--status S …] [--opcode O] [--archived] [--limit N] [--json]
job info ID [--json]
job watch ID                         follow the log until the job ends (exit 1 unless success)
job cancel ID [--reason …]
job submit OPCODE [--param k=v …] [--reason "…" …] [--depends ID[:status,…] …] [--priority N]
           [--user NAME] [--wait]
job retry ID [--reason …]
job archive --older-than DAYS
"""

import json
import time
from contextlib import contextmanager

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework import serializers

from core.changelog import Actor
from jobs import services
from jobs.models import Job

CLI = Actor(name="cli")
POLL = 0.3


def _flatten(detail, prefix=""):
    if isinstance(detail, dict):
        for key, value in detail.items():
            yield from _flatten(value, f"{prefix}{key}.")
    elif isinstance(detail, list) and detail and all(isinstance(i, (dict, list)) for i in detail):
        for index, value in enumerate(detail):
            yield from _flatten(value, f"{prefix}{index}.")
    else:
        messages = detail if isinstance(detail, list) else [detail]
        yield f"{prefix.rstrip('.') or 'error'}: {' '.join(str(m) for m in messages)}"


def invalid(exc):
    return CommandError("\n".join(_flatten(exc.detail)))


@contextmanager
def service_errors():
    """A service's refusal as a CommandError (a clear message, exit status 1)."""
    try:
        yield
    except services.Conflict as exc:
        raise CommandError(str(exc)) from None
    except serializers.ValidationError as exc:
        raise invalid(exc) from None


def parse_param(text):
    """``k=v``; v is read as JSON when it parses (numbers, true, lists), else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise CommandError(f"--param {text!r}: expected name=value")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return key.strip(), parsed


def parse_depends(text):
    """``12`` (success only), ``12:success,error``, ``12:any`` (any final status)."""
    job, _, statuses = text.partition(":")
    try:
        job_id = int(job)
    except ValueError:
        raise CommandError(f"--depends {text!r}: expected a job id, optionally :status,status") from None
    if not statuses:
        return [job_id, ["success"]]
    if statuses == "any":
        return [job_id, []]
    return [job_id, [s.strip() for s in statuses.split(",") if s.strip()]]


def _time(value):
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


class Command(BaseCommand):
    help = "List, inspect, watch, submit, cancel, retry and archive jobs (like gnt-job)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        p = sub.add_parser("list", help="list jobs, newest first")
        p.add_argument("--status", action="append", choices=Job.Status.values, help="repeatable")
        p.add_argument("--opcode")
        p.add_argument("--archived", action="store_true", help="list archived jobs instead")
        p.add_argument("--limit", type=int, default=50)
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("info", help="everything about one job")
        p.add_argument("id", type=int)
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("watch", help="follow a job's log until it ends")
        p.add_argument("id", type=int)

        p = sub.add_parser("cancel", help="cancel a job")
        p.add_argument("id", type=int)
        p.add_argument("--reason", default="")

        p = sub.add_parser("submit", help="submit a job")
        p.add_argument("opcode")
        p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
        p.add_argument("--reason", action="append", default=[], help="repeatable; rate-limit:N:label limits a bucket")
        p.add_argument(
            "--depends",
            action="append",
            default=[],
            metavar="ID[:STATUS,…]",
            help="start after job ID ended in one of the statuses (default success; 'any')",
        )
        p.add_argument("--priority", type=int, default=0)
        p.add_argument("--user", help="submit on behalf of this user")
        p.add_argument("--wait", action="store_true", help="watch the job until it ends")

        p = sub.add_parser("retry", help="submit a failed or canceled job again")
        p.add_argument("id", type=int)
        p.add_argument("--reason", default="")

        p = sub.add_parser("archive", help="archive finished jobs older than N days")
        p.add_argument("--older-than", type=int, required=True, metavar="DAYS")

    def handle(self, *args, **options):
        return getattr(self, f"do_{options['action']}")(options)

    # --- actions --------------------------------------------------------------------
    def do_list(self, options):
        jobs = Job.objects.select_related("submitter").filter(archived=options["archived"])
        if options["status"]:
            jobs = jobs.filter(status__in=options["status"])
        if options["opcode"]:
            jobs = jobs.filter(opcode=options["opcode"])
        jobs = list(jobs.order_by("-id")[: max(1, options["limit"])])
        if options["json"]:
            self.stdout.write(json.dumps([self._summary(job) for job in jobs], indent=2))
            return
        header = f"{'ID':>6}  {'STATUS':<9} {'OPCODE':<18} {'PRIO':>4}  {'SUBMITTER':<12} {'RECEIVED':<19}  NOTE"
        self.stdout.write(header)
        for job in jobs:
            note = job.error_message or job.waiting_for
            who = job.submitter.username if job.submitter else "system"
            self.stdout.write(
                f"{job.pk:>6}  {job.status:<9} {job.opcode:<18} {job.priority:>4}  {who:<12} "
                f"{_time(job.received):<19}  {note[:60]}"
            )

    def do_info(self, options):
        job = self._get(options["id"])
        data = self._detail(job)
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2, default=str))
            return
        for key, value in data.items():
            if key in ("reason", "log"):
                continue
            self.stdout.write(f"{key + ':':<18} {json.dumps(value) if isinstance(value, (dict, list)) else value}")
        self.stdout.write("reason trail:")
        for source, reason, when in job.reason:
            self.stdout.write(f"  {when}  {source}: {reason}")
        self.stdout.write("log:")
        for line in data["log"]:
            self.stdout.write(f"  {line}")

    def do_watch(self, options):
        job = self._get(options["id"])
        self._watch(job)

    def do_cancel(self, options):
        with service_errors():
            job = services.cancel(self._get(options["id"]), actor=CLI, reason=options["reason"])
        if job.status == Job.Status.RUNNING:
            self.stdout.write(f"job {job.pk}: cancel requested; it stops after its current step")
        else:
            self.stdout.write(f"job {job.pk}: {job.status}")

    def do_submit(self, options):
        params = dict(parse_param(text) for text in options["param"])
        depends = [parse_depends(text) for text in options["depends"]]
        submitter = None
        if options["user"]:
            submitter = get_user_model().objects.filter(username=options["user"]).first()
            if submitter is None:
                raise CommandError(f"--user {options['user']!r}: no such user")
        with service_errors():
            job = services.submit(
                options["opcode"],
                params,
                actor=CLI,
                submitter=submitter,
                reason=options["reason"] or None,
                source="cli:job submit",
                priority=options["priority"],
                depends=depends,
            )
        self.stdout.write(f"job {job.pk} submitted ({job.status})")
        if options["wait"]:
            self._watch(job)

    def do_retry(self, options):
        job = self._get(options["id"])
        with service_errors():
            new = services.retry(job, actor=CLI, reason=options["reason"])
        self.stdout.write(f"job {job.pk} retried as job {new.pk} ({new.status})")

    def do_archive(self, options):
        with service_errors():
            count = services.archive(options["older_than"], actor=CLI)
        self.stdout.write(f"archived {count} jobs that ended more than {options['older_than']} days ago")

    # --- helpers --------------------------------------------------------------------
    def _get(self, job_id):
        job = None
        if 0 < job_id <= services.MAX_ID:
            job = Job.objects.select_related("submitter").filter(pk=job_id).first()
        if job is None:
            raise CommandError(f"job {job_id} does not exist")
        return job

    def _watch(self, job):
        after = 0
        while True:
            for entry in job.log_entries.filter(id__gt=after).order_by("id"):
                after = entry.id
                self.stdout.write(f"{entry.time:%H:%M:%S} {entry.level:<7} {entry.message}")
            job.refresh_from_db()
            if job.is_final and not job.log_entries.filter(id__gt=after).exists():
                break
            time.sleep(POLL)
        self.stdout.write(f"job {job.pk} {job.status}" + (f": {job.error_message}" if job.error_message else ""))
        if job.status != Job.Status.SUCCESS:
            raise CommandError(f"job {job.pk} ended {job.status}", returncode=1)

    def _summary(self, job):
        return {
            "id": job.pk,
            "opcode": job.opcode,
            "status": job.status,
            "priority": job.priority,
            "submitter": job.submitter.username if job.submitter else None,
            "received": job.received.isoformat(),
            "waiting_for": job.waiting_for,
            "error": job.error_message,
        }

    def _detail(self, job):
        return {
            **self._summary(job),
            "params": job.params,
            "depends": job.depends,
            "locks": job.locks,
            "buckets": job.buckets,
            "parent": job.parent_id,
            "children": list(job.children.order_by("id").values_list("id", flat=True)),
            "retry_of": job.retry_of_id,
            "started": _time(job.started),
            "ended": _time(job.ended),
            "attempt": job.attempt,
            "runner": job.runner,
            "progress": job.progress,
            "steps": [step["name"] for step in job.steps],
            "result": job.result,
            "error_kind": job.error_kind,
            "archived": job.archived,
            "reason": job.reason,
            "log": [f"{e.time:%H:%M:%S} {e.level:<7} {e.message}" for e in job.log_entries.order_by("id")],
        }
