"""Run one claimed job in a worker: steps, lease, cancellation, hand-off, expansion.

``execute(job_id, token, deadline)`` calls the opcode with a ``JobContext``. Every step's
completion is one conditional UPDATE guarded by the lease token: it records the step's
result, the progress, and renews the lease. If the UPDATE matches nothing, the job is no
longer ours (recovered after a lost lease, or ended elsewhere) and the run stops quietly.
A heartbeat thread renews the lease while the job runs. Between steps the runner checks
for a cancel request, and for its time budget: past ``deadline`` it hands the job to a
fresh django-q2 task instead of risking django-q2's timeout (which would kill the worker).
"""

import json
import logging
import os
import threading
import time
import traceback
from datetime import timedelta

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django_q.exceptions import TimeoutException

from provisioning.jobs import reasons, registry, transitions, wake
from provisioning.jobs.models import Job, QueueSettings
from vclmgr.changelog import Actor

log = logging.getLogger(__name__)
S = Job.Status


class Canceled(Exception):
    pass


class LeaseLost(Exception):
    pass


class Handoff(Exception):
    pass


def slice_seconds():
    """How long one django-q2 task may run jobs before handing off: half the task timeout."""
    return settings.Q_CLUSTER["timeout"] / 2


def jsonable(value, what):
    try:
        return json.loads(json.dumps(value, cls=DjangoJSONEncoder))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} is not JSON-serializable: {exc}") from None


class Heartbeat:
    """Renews the lease every lease/3 seconds while the job runs.

    One daemon thread per process (its own DB connection) renews the leases of every job
    the process runs; a job registers for the time it runs. Only a live process renews, so
    a lease expires exactly when the worker is gone (or cut off from the database): that
    is what recovery keys on. (One long-lived thread, not one per job: starting and joining
    a thread per job cost more than a tiny job itself.)
    """

    _lock = threading.Lock()  # guards _jobs
    _busy = threading.Lock()  # held by the thread while it renews (and has a DB connection)
    _jobs = {}  # job id -> [token, lease seconds, next renewal (monotonic)]
    _thread = None
    _pid = None

    def __init__(self, job_id, token, lease_seconds):
        self.job_id, self.token, self.lease_seconds = job_id, token, lease_seconds
        self.interval = max(0.5, lease_seconds / 3)

    def __enter__(self):
        cls = type(self)
        if cls._pid != os.getpid():  # a forked child: none of the parent's state carries over
            cls._lock, cls._busy, cls._jobs = threading.Lock(), threading.Lock(), {}
            cls._thread, cls._pid = None, os.getpid()
        with cls._lock:
            cls._jobs[self.job_id] = [self.token, self.lease_seconds, time.monotonic() + self.interval]
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._run, name="jobs-heartbeat", daemon=True)
                cls._thread.start()
        return self

    def __exit__(self, *exc):
        with self._lock:
            entry = self._jobs.get(self.job_id)
            if entry is not None and entry[0] == self.token:
                del self._jobs[self.job_id]
        with self._busy:  # a renewal in flight ends (and closes its connection) before the job does
            pass

    @classmethod
    def _due(cls):
        now = time.monotonic()
        with cls._lock:
            due = [(job_id, entry[0], entry[1]) for job_id, entry in cls._jobs.items() if entry[2] <= now]
            for job_id, _, lease_seconds in due:
                cls._jobs[job_id][2] = now + max(0.5, lease_seconds / 3)
        return due

    @classmethod
    def _run(cls):
        while True:
            time.sleep(0.25)
            with cls._busy:
                due = cls._due()
                if not due:
                    continue
                try:
                    for job_id, token, lease_seconds in due:
                        lease_until = timezone.now() + timedelta(seconds=lease_seconds)
                        Job.objects.filter(pk=job_id, status=S.RUNNING, lease_token=token).update(
                            lease_until=lease_until
                        )
                except Exception:  # the step goes on; a lost lease is noticed at the next checkpoint
                    log.exception("job heartbeat failed")
                finally:
                    # Renewals are lease/3 apart: hold no connection in between (nor when the
                    # job is over, e.g. while a test database is dropped).
                    connection.close()


class JobContext:
    """What an opcode function gets: its params, steps, log, progress and children."""

    def __init__(self, job, token, deadline, lease_seconds):
        self.job = job
        self.job_id = job.id
        self.params = job.params
        self.attempt = job.attempt
        self.reason = job.reason
        self.actor = Actor(name=f"job {job.id}")
        self.token = token
        self.deadline = deadline
        self.lease_seconds = lease_seconds
        self.total = (job.progress or {}).get("total")
        self._steps = list(job.steps)
        self._done = {s["name"]: s["result"] for s in job.steps}
        self._seen = set()
        self._ran = 0
        self._child_seq = 0

    # --- for opcode functions ----------------------------------------------------------
    def step(self, name, fn, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` once as step ``name``; replays the recorded result on retry."""
        if name in self._seen:
            raise ValueError(f"step name {name!r} used twice in one run")
        self._seen.add(name)
        if name in self._done:
            return self._done[name]
        self.checkpoint()
        result = jsonable(fn(*args, **kwargs), f"the result of step {name!r}")
        self._record(name, result)
        return result

    def log(self, message, level="info"):
        transitions.log(self.job, message, level)

    def expect(self, total):
        """Declare how many steps there will be (for progress bars)."""
        self.total = int(total)

    def submit_child(self, opcode, params=None, *, reason=None, priority=None, depends=(), key=None):
        """Expand: submit a child job (idempotent per ``key``, by default its order); returns its id.

        The child inherits this job's reason trail (and so its rate-limit buckets) and
        submitter. This job ends when its steps are done and all children ended.
        """
        from provisioning.jobs import services

        self._child_seq += 1
        key = str(key or f"child-{self._child_seq}")
        existing = Job.objects.filter(parent_id=self.job_id, child_key=key).values_list("id", flat=True).first()
        if existing:
            return existing
        try:
            child = services.submit(
                opcode,
                params,
                actor=self.actor,
                submitter=self.job.submitter,
                reason=reason,
                source=f"vclmgr:expand:job {self.job_id}",
                priority=self.job.priority if priority is None else priority,
                depends=depends,
                parent=self.job,
                child_key=key,
            )
        except IntegrityError:  # the same child submitted concurrently
            return Job.objects.get(parent_id=self.job_id, child_key=key).id
        return child.id

    # --- internals ---------------------------------------------------------------------
    def checkpoint(self):
        row = Job.objects.filter(pk=self.job_id).values("status", "lease_token", "cancel_requested").first()
        if row is None or row["status"] != S.RUNNING or row["lease_token"] != self.token:
            raise LeaseLost()
        if row["cancel_requested"]:
            raise Canceled()
        if self._ran and time.monotonic() > self.deadline:
            raise Handoff()

    def _record(self, name, result):
        now = timezone.now()
        steps = [*self._steps, {"name": name, "result": result, "ended": now.isoformat()}]
        progress = {"done": len(steps), "total": self.total, "step": name}
        with transaction.atomic(), transitions.batched():
            updated = Job.objects.filter(pk=self.job_id, status=S.RUNNING, lease_token=self.token).update(
                steps=steps,
                progress=progress,
                reason=self.job.reason,
                lease_until=now + timedelta(seconds=self.lease_seconds),
            )
            if not updated:
                raise LeaseLost()
            self.job.progress = progress
            transitions.emit_progress(self.job)
            total = f"/{self.total}" if self.total else ""
            transitions.log(self.job, f"step {len(steps)}{total} {name!r} done")
        self._steps = steps
        self._done[name] = result
        self._ran += 1


def execute(job_id, token, deadline, job=None, lease_seconds=None):
    """Run a job this worker claimed. Returns what happened (for logs and tests).

    ``job`` and ``lease_seconds`` come with a fresh claim; a continuation reads them.
    """
    return execute_then_claim(job_id, token, deadline, job, lease_seconds, then_claim=False)[0]


def execute_then_claim(job_id, token, deadline, job=None, lease_seconds=None, then_claim=True):
    """``execute``, and — in the transaction that ends the job — claim the next one.

    Returns ``(outcome, claim or None)``. Ending one job and starting the next under one
    queue lock saves a write transaction per job on the hot path.
    """
    if job is None:
        job = Job.objects.filter(pk=job_id, status=S.RUNNING, lease_token=token).select_related("submitter").first()
    if job is None:
        return "stale", None
    end = _Ender(job, token, then_claim and deadline)
    try:
        op = registry.get(job.opcode)
    except LookupError as exc:
        return end(S.ERROR, error=str(exc), kind="invalid")
    _note_execution(job)
    ctx = JobContext(job, token, deadline, lease_seconds or QueueSettings.get().lease_seconds)
    try:
        with Heartbeat(job.id, token, ctx.lease_seconds):  # also covers code between steps
            value = op.func(ctx)
        value = jsonable(value, "the job's result")
    except Canceled:
        after = f" after step {ctx._steps[-1]['name']!r}" if ctx._steps else " before its first step"
        return end(S.CANCELED, error=f"canceled{after}", kind="canceled")
    except LeaseLost:
        log.warning("job %s: lease lost; another worker owns it now", job_id)
        return "lost", None
    except Handoff:
        return _handoff(job, token), None
    except TimeoutException:
        message = f"a step ran past the task timeout ({settings.Q_CLUSTER['timeout']} s); split it into shorter steps"
        _Ender(job, token, None)(S.ERROR, error=message, kind="timeout")
        raise
    except Exception as exc:
        transitions.log(job, traceback.format_exc()[-4000:], "debug")
        return end(S.ERROR, error=f"{type(exc).__name__}: {exc}", kind="exception")
    if ctx._child_seq or job.attempt > 1:  # it may have children (this run or an earlier one)
        expanded = _expand(job, token, value)
        if expanded:
            return expanded, None
    return end(S.SUCCESS, result=value)


class _Ender:
    """End the job (token-guarded) and optionally claim the next, in one locked transaction."""

    OUTCOME = {S.SUCCESS: "success", S.ERROR: "error", S.CANCELED: "canceled"}

    def __init__(self, job, token, claim_until):
        """``claim_until``: a monotonic deadline for claiming the next job, or None (do not)."""
        self.job, self.token, self.claim_until = job, token, claim_until

    def __call__(self, status, **fields):
        from provisioning.jobs import dispatcher

        with transaction.atomic(), transitions.batched():
            queue = QueueSettings.lock()
            done = transitions.finish(self.job.id, self.token, status, locked=True, reason=self.job.reason, **fields)
            claim = None
            if self.claim_until and time.monotonic() < self.claim_until:
                claim = dispatcher.claim_locked(queue)
        return (self.OUTCOME[status] if done else "lost"), claim


def _note_execution(job):
    """The execution layer's entry in the reason trail (once per job).

    Kept in memory (children submitted now inherit it) and written with the next step
    record or the job's end, which are writes anyway.
    """
    source = f"vclmgr:opcode:{job.opcode}"
    if not any(item[0] == source for item in job.reason):
        job.reason = [*job.reason, reasons.entry(source, "executed")]


def _expand(job, token, value):
    """If the job submitted children: wait for them ("expanded"); None when it has none."""
    with transaction.atomic(), transitions.batched():
        QueueSettings.lock()
        children = Job.objects.filter(parent_id=job.id).count()
        if not children:
            return None
        updated = transitions.update(
            Job.objects.filter(pk=job.id, status=S.RUNNING, lease_token=token),
            reason=job.reason,
            status=S.WAITING,
            awaiting_children=True,
            lease_token="",
            lease_until=None,
            result={"result": value},
            waiting_for=f"children: {children} submitted",
        )
        if updated is None:
            return "lost"
        transitions.announce(updated, f"steps done; waiting for {children} child jobs")
        parent = transitions.complete_parent(job.id)
        if parent:
            transitions.settle(parent)
    return "expanded"


def _handoff(job, token):
    grace = timedelta(seconds=settings.Q_CLUSTER["retry"])
    if not Job.objects.filter(pk=job.id, status=S.RUNNING, lease_token=token).update(
        lease_until=timezone.now() + grace, reason=job.reason
    ):
        return "lost"
    transitions.log(job, "continuing in a fresh task (this one used half of the task timeout)", "debug")
    wake.continue_job(job.id, token)
    return "handoff"
