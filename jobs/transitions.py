"""Status changes, log lines and their events: the only code that moves a job between states.

Every status change runs in a transaction holding the queue lock (``QueueSettings.lock``),
is a conditional UPDATE on the old status (a stale actor changes nothing), writes a log
line, and emits events to ``job.<id>``, ``user.<submitter>`` and ``admin`` in the same
transaction. Ending a job settles what depended on it at once: dependents whose accepted
statuses exclude the outcome fail, a parent whose last child ended completes, the children
of a canceled job are canceled.

Hot paths wrap their transaction in ``batched()``: log lines and events written in it are
collected and inserted at its end (still inside the transaction): the log lines in one
INSERT, the change-log rows and events in one more (PostgreSQL) or two (SQLite).
"""

import threading
from collections.abc import Callable
from contextlib import contextmanager

from django.db import connection, transaction
from django.utils import timezone

from core import bulk, changelog, events
from core.changelog import Actor
from core.hooks import Hook
from jobs.models import Job, JobDependency, JobLog, QueueSettings, update_returning

S = Job.Status
LEVEL_OF = {S.SUCCESS: "info", S.ERROR: "error", S.CANCELED: "warning"}
# What follows the end of a job of an opcode, registered by opcode by the apps above:
# ``hook(job)`` (the lean job as it ended) in the transaction that ends it, holding the queue
# lock, whichever way it ended: its run, a cancel, a failed dependency, a lost worker given up
# on, its children's end. (Every end passes through ``settle``.)
ON_END: Hook[Callable[[Job], None]] = Hook("jobs.transitions.ON_END", keyed=True)


def topics(job_id, submitter_id):
    found = [f"job.{job_id}", "admin"]
    if submitter_id:
        found.insert(1, f"user.{submitter_id}")
    return found


def _iso(value):
    return value.isoformat() if value else None


def payload(job):
    return {
        "id": job.id,
        "opcode": job.opcode,
        "status": job.status,
        "priority": job.priority,
        "submitter": job.submitter_id,
        "parent": job.parent_id,
        "waiting_for": job.waiting_for,
        "awaiting_children": job.awaiting_children,
        "progress": job.progress,
        "attempt": job.attempt,
        "cancel_requested": job.cancel_requested,
        "error_kind": job.error_kind,
        "error_message": job.error_message[:500],
        "received": _iso(job.received),
        "started": _iso(job.started),
        "ended": _iso(job.ended),
    }


# --- batching log lines and events ---------------------------------------------------------
_local = threading.local()


class _Batch:
    """Log rows and events of one transaction, in the order they happened."""

    def __init__(self):
        self.depth = len(connection.savepoint_ids)
        self.logs = []
        self.items = []  # [kind, data or a JobLog row, topics]
        self.changes = []  # change-log rows (``changelog.record``'s columns)

    def take_event(self, kind, data, where):
        if not self.active():
            return False
        self.items.append((kind, data, where))
        return True

    def take_change(self, row):
        if not self.active():
            return False
        self.changes.append(row)
        return True

    def active(self):
        # Inside a savepoint opened since the batch began, write at once: a rollback to
        # that savepoint must take its lines and events with it.
        return not any(connection.savepoint_ids[self.depth :])

    def flush(self):
        if self.logs and not connection.features.can_return_rows_from_bulk_insert:  # SQLite < 3.35
            for row in self.logs:
                row.save(force_insert=True)
        elif self.logs:
            names = ["job", "time", "level", "message"]
            values = [(row.job_id, row.time, row.level, row.message) for row in self.logs]
            for row, pk in zip(self.logs, bulk.insert_rows(JobLog, names, values, returning="id"), strict=True):
                row.id = pk
                row._state.adding = False
        items = [
            (kind, _log_data(data) if isinstance(data, JobLog) else data, where) for kind, data, where in self.items
        ]
        # The change-log rows with the events: one statement on PostgreSQL (``bulk.insert_rows``).
        events.emit_many(items, rows=False, first=changelog.insert_of(self.changes) if self.changes else None)


@contextmanager
def batched():
    """Collect the log lines, events (also ``core.events.emit``'s) and change-log rows
    (``core.changelog.record``'s) written in this block; insert them at its end (one INSERT
    per table).

    Use it inside the transaction that makes the changes (the rows are written before it
    commits). Nested use joins the outer batch. On an exception nothing is written: the
    transaction is rolled back anyway.
    """
    if getattr(_local, "batch", None) is not None:
        yield
        return
    batch = _local.batch = _Batch()
    events_before = events.deferred_to(batch.take_event)
    changes_before = changelog.deferred_to(batch.take_change)
    try:
        yield
    finally:
        _local.batch = None
        events.deferred_to(events_before)
        changelog.deferred_to(changes_before)
    batch.flush()


def _batch():
    batch = getattr(_local, "batch", None)
    return batch if batch is not None and batch.active() else None


def _emit(kind, data, where):
    batch = _batch()
    if batch is None:
        events.emit(kind, data, where)
    else:
        batch.items.append((kind, data, where))


def _log_data(row):
    return {"id": row.id, "job": row.job_id, "time": row.time.isoformat(), "level": row.level, "message": row.message}


def emit_status(job):
    _emit("job.status", payload(job), topics(job.id, job.submitter_id))


def emit_progress(job):
    data = {"id": job.id, "status": job.status, "progress": job.progress}
    _emit("job.progress", data, topics(job.id, job.submitter_id))


def log(job, message, level="info"):
    """Append a line to the job's log and emit it (in the caller's transaction, if any).

    In a ``batched()`` block the row is inserted at the block's end (its id is set then).
    """
    row = JobLog(job_id=job.id, level=level, message=str(message)[:10000], time=timezone.now())
    to = ["admin"] if level in JobLog.STAFF_ONLY_LEVELS else topics(job.id, job.submitter_id)
    batch = _batch()
    if batch is not None:
        batch.logs.append(row)
        batch.items.append(("job.log", row, to))
        return row
    with transaction.atomic(savepoint=False):
        row.save(force_insert=True)
        events.emit("job.log", _log_data(row), to)
    return row


# What events and settle() need: the wide JSON columns (params, steps, result…) stay unread.
LEAN_FIELDS = [
    "id",
    "opcode",
    "status",
    "priority",
    "submitter_id",
    "parent_id",
    "waiting_for",
    "awaiting_children",
    "progress",
    "attempt",
    "cancel_requested",
    "error_kind",
    "error_message",
    "received",
    "started",
    "ended",
    "has_dependents",
]


def changed(job_id, message=None, level="info"):
    """Reload a job after an UPDATE, log the change and emit it; returns the (lean) job."""
    return announce(Job.objects.only(*LEAN_FIELDS).get(pk=job_id), message, level)


def announce(job, message=None, level="info"):
    """Log a change of ``job`` (as it is now) and emit its status; returns the job."""
    if message:
        log(job, message, level)
    emit_status(job)
    return job


def update(queryset, **values):
    """A conditional UPDATE of one job; the (lean) job as it is after it, or None if nothing matched."""
    rows = update_returning(queryset, LEAN_FIELDS, **values)
    return rows[0] if rows else None


def finish(
    job_id,
    token,
    status,
    *,
    result=None,
    error="",
    kind="",
    message=None,
    locked=False,
    where=None,
    trace=None,
    then=None,
    **extra,
):
    """A running job ends (guarded by its lease token). The job, or None if it was not ours.

    ``locked``: the caller already holds the queue lock in its transaction. ``where``: more
    conditions the row must meet (the runner's lease generation); ``extra``: more fields to
    write; ``trace``: a staff-only log line written before the end's own, only if it ended;
    ``then(job)``: called likewise (the runner logs a last step recorded with the end).
    """
    with transaction.atomic(savepoint=False):
        if not locked:
            QueueSettings.lock()
        job = update(
            Job.objects.filter(pk=job_id, status=S.RUNNING, lease_token=token, **(where or {})),
            **extra,
            status=status,
            ended=timezone.now(),
            result=result,
            error_message=error[:5000],
            error_kind=kind,
            lease_token="",
            lease_until=None,
            waiting_for="",
        )
        if job is None:
            return None
        if then is not None:
            then(job)
        if trace:
            log(job, trace, "debug")
        announce(job, message or (f"{status}: {error}" if error else status), LEVEL_OF.get(status, "info"))
        settle(job)
    return job


def end_pending(job_id, status, *, kind, message):
    """A queued or waiting job ends without running (canceled, failed dependency). Caller holds the lock."""
    job = update(
        Job.objects.filter(pk=job_id, status__in=Job.PENDING),
        status=status,
        ended=timezone.now(),
        error_message=message[:5000],
        error_kind=kind,
        waiting_for="",
        awaiting_children=False,
    )
    if job is None:
        return None
    return announce(job, f"{status}: {message}", LEVEL_OF.get(status, "info"))


def request_cancel(job, *, actor, reason=""):
    """A running job stops at its next step boundary. Caller holds the lock."""
    updated = update(Job.objects.filter(pk=job.pk, status=S.RUNNING, cancel_requested=False), cancel_requested=True)
    if updated:
        why = f": {reason}" if reason else ""
        by = Actor.of(actor).label
        announce(updated, f"cancel requested by {by}{why}; stopping after the current step", "warning")


def settle(job):
    """Consequences of ``job`` having ended, transitively (iterative: chains can be long)."""
    work = [job]
    while work:
        done = work.pop()
        for hook in ON_END.for_key(done.opcode):
            hook(done)
        dependents = ()
        if done.has_dependents:  # (building the query costs even when it is not run)
            dependents = JobDependency.objects.filter(on_id=done.id, job__status__in=Job.PENDING).order_by("job_id")
        for dep in dependents:
            if dep.accepted and done.status not in dep.accepted:
                message = f"dependency job {done.id} ended {done.status}; accepted: {', '.join(dep.accepted)}"
                failed = end_pending(dep.job_id, S.ERROR, kind="dependency", message=message)
                if failed:
                    work.append(failed)
        if done.status == S.CANCELED:
            for child in Job.objects.filter(parent_id=done.id).exclude(status__in=Job.FINAL):
                if child.status == S.RUNNING:
                    request_cancel(child, actor=f"parent job {done.id}")
                else:
                    canceled = end_pending(
                        child.id, S.CANCELED, kind="canceled", message=f"parent job {done.id} canceled"
                    )
                    if canceled:
                        work.append(canceled)
        if done.parent_id:
            parent = complete_parent(done.parent_id)
            if parent:
                work.append(parent)


def complete_parent(parent_id):
    """End a parent waiting for its children once the last one ended; None while some run."""
    parent = Job.objects.filter(pk=parent_id, status=S.WAITING, awaiting_children=True).first()
    if parent is None:
        return None
    children = list(Job.objects.filter(parent_id=parent_id).order_by("id").values_list("id", "status", "error_message"))
    unfinished = [c for c in children if c[1] not in Job.FINAL]
    if unfinished:
        waiting_for = f"children: {len(unfinished)} of {len(children)} unfinished"
        if parent.waiting_for != waiting_for:
            Job.objects.filter(pk=parent_id).update(waiting_for=waiting_for)
            changed(parent_id)
        return None
    summary = {status: [c[0] for c in children if c[1] == status] for status in Job.FINAL}
    result = {"result": (parent.result or {}).get("result"), "children": summary}
    failed = [c for c in children if c[1] != S.SUCCESS]
    fields = {"status": S.SUCCESS, "error_message": "", "error_kind": ""}
    if failed:
        shown = ", ".join(
            f"job {cid} {status}" + (f" ({error[:80]})" if error else "") for cid, status, error in failed[:5]
        )
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        message = f"{len(failed)} of {len(children)} child jobs did not succeed: {shown}{more}"
        fields = {"status": S.ERROR, "error_message": message[:5000], "error_kind": "children"}
    updated = update(
        Job.objects.filter(pk=parent_id, status=S.WAITING, awaiting_children=True),
        awaiting_children=False,
        ended=timezone.now(),
        waiting_for="",
        result=result,
        **fields,
    )
    if updated is None:
        return None
    note = fields["error_message"] or f"all {len(children)} child jobs succeeded"
    return announce(updated, f"{fields['status']}: {note}", LEVEL_OF[fields["status"]])


def recover(job_id, max_attempts, now=None):
    """A running job whose lease expired: back to queued (resume) or error. Caller holds the lock."""
    now = now or timezone.now()
    job = Job.objects.filter(pk=job_id, status=S.RUNNING, lease_until__lt=now).first()
    if job is None:
        return None
    lost = f"worker {job.runner or '?'} stopped renewing the lease (expired {job.lease_until:%H:%M:%S})"
    # The lease condition is checked again by the UPDATE: a heartbeat may just have renewed it.
    still_lost = {"lease_until__lt": now}
    if job.attempt < max_attempts:
        held = Job.objects.filter(pk=job_id, status=S.RUNNING, lease_token=job.lease_token, **still_lost)
        return requeue(held, job.attempt, max_attempts, lost, "a lost worker")
    message = f"{lost} on attempt {job.attempt} of {max_attempts}; giving up"
    return finish(job_id, job.lease_token, S.ERROR, error=message, kind="lost", locked=True, where=still_lost)


def requeue(held, attempt, max_attempts, what, after):
    """A running job back to the queue, to resume after its last recorded step (its steps are
    safe to run again). ``held``: the job's row on the conditions that make it still the
    caller's to give back; ``what`` happened, in the log; ``after``: the cause, in its waiting
    line. The job, or None when it was not the caller's. Caller holds the lock."""
    requeued = update(
        held,
        status=S.QUEUED,
        lease_token="",
        lease_until=None,
        runner="",
        waiting_for=f"retry {attempt + 1} of {max_attempts} after {after}",
    )
    if requeued is None:
        return None
    last = (requeued.progress or {}).get("step")  # written with the steps' records
    resume = f"after step {last!r}" if last else "from the start"
    return announce(requeued, f"{what}; will resume {resume} (attempt {attempt + 1} of {max_attempts})", "warning")
