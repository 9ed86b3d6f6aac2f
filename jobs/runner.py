"""Run one claimed job in a worker: steps, lease, fencing, cancellation, hand-off, expansion.

``execute(job_id, token, deadline)`` calls the opcode with a ``JobContext``. The run holds a
``Lease``: the job's token (fresh at each claim) and its generation (the job's ``attempt``,
raised by one at every claim, so a takeover after a lost lease always raises it). Every
write of the run is conditional on both, in the statement that makes it: the check before
each step (which also renews the lease), each step's record (result, progress, reason
trail), each log line, the heartbeat, and the job's end. A write that matches no row means
the job is no longer ours (recovered after a lost lease, taken over by another worker, or
ended elsewhere): the run raises ``LeaseLost`` and stops quietly, writing nothing more.
Hypervisor calls are fenced by the same lease (``core.fencing``, checked before and after
every driver call): a worker that was frozen or cut off past its lease makes no further
driver call when it comes back. A heartbeat thread renews the lease while the job runs.

Between steps the runner checks for a cancel request, and for its time budget: past
``deadline`` it hands the job to a fresh django-q2 task instead of risking django-q2's
timeout (which would kill the worker). The write that ended the step before (its record, or
the claim before the first step) is that check when it was sent less than ``FRESH_SECONDS``
ago: it proved the lease ours and read the cancel flag, and no one can take a job over
within its lease (the driver fence trusts a longer window on the same ground), so the
check costs no statement on the hot path.
"""

import json
import logging
import os
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone
from django_q.exceptions import TimeoutException

from core import fencing, reconnect
from core.changelog import Actor
from core.fencing import LeaseLost
from jobs import kept_records, reasons, registry, transitions, wake
from jobs.models import Job, QueueSettings, update_returning

log = logging.getLogger(__name__)
S = Job.Status
FRESH_SECONDS = 1.0  # a step starting this soon after the last write that checked the job needs no check of its own


class Canceled(Exception):
    pass


class Handoff(Exception):
    pass


_STEP = object()  # (last_db_step: the job's result is the step's)


class _NotEnded(Exception):
    """Rolls back a last step whose job could not end (see ``JobContext.last_db_step``)."""


def slice_seconds():
    """How long one django-q2 task may run jobs before handing off: half the task timeout."""
    return settings.Q_CLUSTER["timeout"] / 2


def jsonable(value, what):
    try:
        return json.loads(json.dumps(value, cls=DjangoJSONEncoder))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} is not JSON-serializable: {exc}") from None


class Lease:
    """A run's hold on its job: ``held()`` is the job's row while (and only while) it is ours.

    ``confirmed`` is when (monotonic, taken before the statement was sent) a conditional write
    last proved the lease ours; for ``trusted`` seconds after it (two thirds of the lease, the
    rest a margin for clock skew between machines) nobody else can have taken the job over.
    ``check()`` (the driver fence) trusts that window and otherwise confirms with a write.
    """

    def __init__(self, job_id, token, generation, lease_seconds, confirmed=None):
        self.job_id, self.token, self.generation = job_id, token, generation
        self.lease_seconds = lease_seconds
        self.trusted = lease_seconds * 2 / 3
        self.confirmed = time.monotonic() if confirmed is None else confirmed
        self.lost = False

    def held(self):
        return Job.objects.filter(pk=self.job_id, status=S.RUNNING, lease_token=self.token, attempt=self.generation)

    def until(self, now=None):
        return (now or timezone.now()) + timedelta(seconds=self.lease_seconds)

    def confirm(self, sent, matched):
        """Record the outcome of a conditional write sent at ``sent``; raise ``LeaseLost`` if it matched nothing."""
        if not matched:
            self.lost = True
            raise LeaseLost(f"job {self.job_id}: lease {self.generation} lost")
        self.confirmed = max(self.confirmed, sent)

    def renew(self, **fields):
        """Extend the lease (writing ``fields`` with it) or raise ``LeaseLost``."""
        sent = time.monotonic()
        self.confirm(sent, self.held().update(lease_until=self.until(), **fields))

    def check(self):
        if self.lost:
            raise LeaseLost(f"job {self.job_id}: lease {self.generation} lost")
        if time.monotonic() - self.confirmed >= self.trusted:
            self.renew()


class Heartbeat:
    """Renews the lease every lease/3 seconds while the job runs.

    One daemon thread per process (its own DB connection) renews the leases of every job
    the process runs; a job registers for the time it runs. Only a live process renews, so
    a lease expires exactly when the worker is gone (or cut off from the database): that
    is what recovery keys on. A renewal that matches nothing marks the lease lost, so the
    run's next driver call or write stops it. (One long-lived thread, not one per job:
    starting and joining a thread per job cost more than a tiny job itself.)
    """

    _lock = threading.Lock()  # guards _jobs
    _busy = threading.Lock()  # held by the thread while it renews (and has a DB connection)
    _jobs = {}  # job id -> [lease, next renewal (monotonic)]
    _thread = None
    _pid = None

    def __init__(self, lease):
        self.lease = lease
        self.interval = max(0.5, lease.lease_seconds / 3)

    def __enter__(self):
        cls = type(self)
        if cls._pid != os.getpid():  # a forked child: none of the parent's state carries over
            cls._lock, cls._busy, cls._jobs = threading.Lock(), threading.Lock(), {}
            cls._thread, cls._pid = None, os.getpid()
        with cls._lock:
            cls._jobs[self.lease.job_id] = [self.lease, time.monotonic() + self.interval]
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._run, name="jobs-heartbeat", daemon=True)
                cls._thread.start()
        return self

    def __exit__(self, *exc):
        self._forget(self.lease)
        with self._busy:  # a renewal in flight ends (and closes its connection) before the job does
            pass

    @classmethod
    def _forget(cls, lease):
        with cls._lock:
            entry = cls._jobs.get(lease.job_id)
            if entry is not None and entry[0] is lease:
                del cls._jobs[lease.job_id]

    @classmethod
    def _due(cls):
        now = time.monotonic()
        with cls._lock:
            due = [entry[0] for entry in cls._jobs.values() if entry[1] <= now]
            for lease in due:
                cls._jobs[lease.job_id][1] = now + max(0.5, lease.lease_seconds / 3)
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
                    for lease in due:
                        try:
                            lease.renew()
                        except LeaseLost:  # the run stops at its next write or driver call
                            log.warning("job %s: lease %s lost", lease.job_id, lease.generation)
                            cls._forget(lease)
                except Exception:  # the step goes on; a lost lease is noticed at the next checkpoint
                    log.exception("job heartbeat failed")
                finally:
                    # Renewals are lease/3 apart: hold no connection in between (nor when the
                    # job is over, e.g. while a test database is dropped).
                    connection.close()


class JobContext:
    """What an opcode function gets: its params, steps, log, progress and children."""

    def __init__(self, job, lease, deadline, checked=False, end=None):
        """``checked``: the lease was just granted by a claim (which clears the cancel flag);
        ``end``: the run's ``_Ender`` (``last_db_step`` ends the job with it)."""
        self.job = job
        self._end, self.ended = end, None
        if end is not None:
            end.ctx = self  # the end writes the step records this run kept first
        self.job_id = job.id
        self.params = job.params
        self.attempt = job.attempt
        self.reason = job.reason
        self.actor = Actor(name=f"job {job.id}")
        self.lease = lease
        self.token = lease.token
        self.generation = lease.generation  # orders the runs of this job: a later run has a higher one
        self.deadline = deadline
        self.lease_seconds = lease.lease_seconds
        self.total = (job.progress or {}).get("total")
        self._steps = list(job.steps)
        self._done = {s["name"]: s["result"] for s in job.steps}
        self._seen = set()
        self._later = []  # records of steps done but not yet written (``step_recorded_later``)
        self._writing = False  # in a database step's transaction, which writes its own record
        self._ran = 0
        self._child_seq = 0
        # (monotonic time, cancel flag) read by the last write that proved the lease ours
        self._checked = (lease.confirmed, False) if checked else None

    # --- for opcode functions ----------------------------------------------------------
    def step(self, name, fn, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` once as step ``name``; replays the recorded result on retry."""
        ran, result = self._once(name, fn, args, kwargs)
        if ran:
            self._record(name, result)
        return result

    def step_recorded_later(self, name, fn, *args, **kwargs):
        """``step`` whose record is kept and written by the run's next database write
        (``kept_records``): a database step's transaction, the job's end, a block of the run's
        own writes marked ``kept_records.carrying()`` (a VM's state change at the start of the
        next step), or the check before a step when the last one is no longer fresh. A crash in
        between runs it again, as a crash before any step's record would: it must be as safe
        to repeat (a wait, a read, a driver call that finds its work done)."""
        ran, result = self._once(name, fn, args, kwargs)
        if ran:
            self._later.append({"name": name, "result": result, "ended": timezone.now().isoformat()})
            self._done[name] = result
            self._ran += 1
        return result

    def _once(self, name, fn, args, kwargs):
        """``(True, result)`` for a step run now, ``(False, result)`` for one replayed from its record."""
        if name in self._seen:
            raise ValueError(f"step name {name!r} used twice in one run")
        self._seen.add(name)
        if name in self._done:
            return False, self._done[name]
        self.checkpoint()
        return True, jsonable(fn(*args, **kwargs), f"the result of step {name!r}")

    def keeps_records(self):
        """Does the run keep step records to write (and is it not writing one now)?"""
        return bool(self._later) and not self._writing

    def write_kept_records(self):
        """The kept records, in the caller's transaction and batch (``kept_records.carrying``):
        lease-checked (else ``LeaseLost``); a cancel it reads stops the run at its next check.
        Taken as written at once: if the caller's transaction rolls back, the next record
        (which writes the whole list) writes them, or their steps run again on a retry."""
        self._write_record(None, None)
        self._recorded(None, None)

    def flush(self):
        """Write the records ``step_recorded_later`` kept, if any (a lease-checked write)."""
        if self._later:
            with transaction.atomic(), transitions.batched():
                self._write_record(None, None)
            self._recorded(None, None)

    def log(self, message, level="info"):
        """A line in the job's log, written only while the lease is ours (else ``LeaseLost``)."""
        self.flush()
        with transaction.atomic(), transitions.batched():
            self.lease.renew()
            transitions.log(self.job, message, level)

    def expect(self, total):
        """Declare how many steps there will be (for progress bars)."""
        self.total = int(total)

    def submit_child(self, opcode, params=None, *, reason=None, priority=None, depends=(), key=None):
        """Expand: submit a child job (idempotent per ``key``, by default its order); returns its id.

        The child inherits this job's reason trail (and so its rate-limit buckets) and
        submitter. This job ends when its steps are done and all children ended.
        """
        from jobs import services

        self._child_seq += 1
        key = str(key or f"child-{self._child_seq}")
        existing = Job.objects.filter(parent_id=self.job_id, child_key=key).values_list("id", flat=True).first()
        if existing:
            return existing
        self.flush()
        self.lease.check()
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
    def db_step(self, name, fn, *args, **kwargs):
        """``step`` for a step that only reads and writes the database (no driver call, no
        waiting): it runs in the transaction of its own record, so its writes commit exactly
        when the record does, which is conditional on the lease. A run that lost its lease, or
        whose job was asked to cancel, rolls the step back whole: as strict as the check before
        a ``step`` (which it needs no write for) and exactly once even across a crash.
        """
        if name in self._seen:
            raise ValueError(f"step name {name!r} used twice in one run")
        self._seen.add(name)
        if name in self._done:
            return self._done[name]
        if self.lease.lost:
            raise LeaseLost(f"job {self.job_id}: lease {self.lease.generation} lost")
        if self._ran and time.monotonic() > self.deadline:
            raise Handoff()
        with transaction.atomic(), transitions.batched(), self._own_record():
            result = jsonable(fn(*args, **kwargs), f"the result of step {name!r}")
            if self._write_record(name, result):
                raise Canceled()  # asked before the step committed: none of it happened
        self._recorded(name, result)
        return result

    def last_db_step(self, name, fn, *args, job_result=_STEP, **kwargs):
        """``db_step`` for the job's last step (of an opcode that submits no children): it runs
        in the transaction that ends the job, so its writes commit exactly when the job's
        success does, conditional on the lease, with its record in the same UPDATE (a job of one
        database step costs one transaction). The opcode returns at once what it returns, which
        is the job's result: ``job_result``, else the step's."""
        if self._child_seq:
            raise ValueError("a job with children ends when they do: use db_step")
        if name in self._seen or name in self._done:  # (cannot be done: the job would have ended)
            raise ValueError(f"step name {name!r} used twice")
        self._seen.add(name)
        if self.lease.lost:
            raise LeaseLost(f"job {self.job_id}: lease {self.lease.generation} lost")
        if self._ran and time.monotonic() > self.deadline:
            raise Handoff()
        steps, progress = self._next_record(name, None)
        try:
            with transaction.atomic(), transitions.batched(), self._own_record():
                queue = QueueSettings.lock()  # first, as every status change: the step's rows after it
                result = jsonable(fn(*args, **kwargs), f"the result of step {name!r}")
                steps[-1]["result"] = result
                value = result if job_result is _STEP else jsonable(job_result, "the job's result")
                ended = self._end.locked(
                    queue,
                    S.SUCCESS,
                    result=value,
                    steps=steps,
                    progress=progress,
                    where={"cancel_requested": False},
                    then=lambda job: self._note_record(job, name, steps),
                )
                if ended[0] == "lost":  # a cancel asked before the end, or the lease lost: none of it happened
                    raise _NotEnded(self.lease.held().filter(cancel_requested=True).exists())
        except _NotEnded as not_ended:
            if not_ended.args[0]:
                raise Canceled() from None
            self.lease.lost = True
            raise LeaseLost(f"job {self.job_id}: lease {self.lease.generation} lost") from None
        self.ended = ended
        self._recorded(name, result)
        return value

    def checkpoint(self):
        """Before a step: renew the lease (the write proves it ours), then cancel and time budget.

        A record, claim or check sent within ``FRESH_SECONDS`` did both already (see the
        module), for every step starting in that time; past it, the records kept by
        ``step_recorded_later`` are written, and their write is the check."""
        if self._later and not _fresh(self._checked):
            self.flush()
        checked = self._checked
        if self.lease.lost:
            raise LeaseLost(f"job {self.job_id}: lease {self.lease.generation} lost")
        if not _fresh(checked):
            sent = time.monotonic()
            rows = update_returning(self.lease.held(), ["cancel_requested"], lease_until=self.lease.until())
            self.lease.confirm(sent, rows)
            checked = self._checked = (sent, rows[0].cancel_requested)
        if checked[1]:
            raise Canceled()
        if self._ran and time.monotonic() > self.deadline:
            raise Handoff()

    @contextmanager
    def _own_record(self):
        """A database step's transaction: it writes the kept records with its own."""
        self._writing = True
        try:
            yield
        finally:
            self._writing = False

    def _record(self, name, result):
        with transaction.atomic(), transitions.batched():
            self._write_record(name, result)
        self._recorded(name, result)

    def _write_record(self, name, result):
        """The step's record, conditional on the lease (else ``LeaseLost``), in the caller's
        transaction and batch; returns whether a cancel was requested."""
        steps, progress = self._next_record(name, result)
        sent = time.monotonic()
        rows = update_returning(
            self.lease.held(),
            ["cancel_requested"],
            lease_until=self.lease.until(),
            steps=steps,
            progress=progress,
            reason=self.job.reason,
        )
        self.lease.confirm(sent, rows)
        self._checked = (sent, rows[0].cancel_requested)
        self.job.progress = progress
        self._note_record(self.job, name, steps)
        return rows[0].cancel_requested

    def _next_record(self, name, result):
        """The job's steps and progress once step ``name`` is recorded (after those kept by
        ``step_recorded_later``); ``name`` None: only those."""
        steps = [*self._steps, *self._later]
        if name is not None:
            steps.append({"name": name, "result": result, "ended": timezone.now().isoformat()})
        return steps, {"done": len(steps), "total": self.total, "step": steps[-1]["name"]}

    def _note_record(self, job, name, steps):
        """The steps' progress event and log lines (``job`` as recorded), in the record's batch."""
        transitions.emit_progress(job)
        total = f"/{self.total}" if self.total else ""
        for number in range(len(self._steps) + 1, len(steps) + 1):
            transitions.log(job, f"step {number}{total} {steps[number - 1]['name']!r} done")
        self._pending_steps = steps

    def _recorded(self, name, result):
        """After the record committed: the run's memory of its steps (``name`` None: only
        the kept ones were recorded)."""
        self._steps = self._pending_steps
        self._later = []
        if name is not None:
            self._done[name] = result
            self._ran += 1


def _fresh(checked):
    """Was the check (monotonic time, cancel flag) sent within ``FRESH_SECONDS``?"""
    return checked is not None and time.monotonic() - checked[0] < FRESH_SECONDS


def execute(job_id, token, deadline, job=None, lease_seconds=None):
    """Run a job this worker claimed. Returns what happened (for logs and tests).

    ``job`` and ``lease_seconds`` come with a fresh claim; a continuation reads them.
    """
    return execute_then_claim(job_id, token, deadline, job, lease_seconds, then_claim=False)[0]


def execute_then_claim(job_id, token, deadline, job=None, lease_seconds=None, then_claim=True):
    """``execute``, and — in the transaction that ends the job — claim the next one.

    Returns ``(outcome, claim)``: the next job's claim, False when the end found none
    startable under its lock, None when it did not look. Ending one job and starting the next
    under one queue lock saves a write transaction per job on the hot path.
    """
    continued = job is None
    if continued:
        job = Job.objects.filter(pk=job_id, status=S.RUNNING, lease_token=token).select_related("submitter").first()
    if job is None:
        return "stale", None
    lease = Lease(job.id, token, job.attempt, lease_seconds or QueueSettings.get().lease_seconds)
    end = _Ender(job, lease, then_claim and deadline)
    try:
        op = registry.get(job.opcode)
    except LookupError as exc:
        return end(S.ERROR, error=str(exc), kind="invalid")
    _note_execution(job)
    ctx = JobContext(job, lease, deadline, checked=not continued, end=end)
    try:
        if continued:  # handed off: the lease was granted to the task before; prove it is still ours
            lease.renew()
        with Heartbeat(lease), fencing.holding(lease), kept_records.running(ctx):  # also covers code between steps
            value = op.func(ctx)
        value = jsonable(value, "the job's result")
    except Canceled:
        done = [*ctx._steps, *ctx._later]  # (the kept records are written with the end)
        after = f" after step {done[-1]['name']!r}" if done else " before its first step"
        return end(S.CANCELED, error=f"canceled{after}", kind="canceled")
    except LeaseLost:
        log.warning("job %s: lease %s lost; another worker owns it now", job_id, lease.generation)
        return "lost", None
    except Handoff:
        return _handoff(job, lease, ctx), None
    except TimeoutException:
        message = f"a step ran past the task timeout ({settings.Q_CLUSTER['timeout']} s); split it into shorter steps"
        _Ender(job, lease, None)(S.ERROR, error=message, kind="timeout")
        raise
    except Exception as exc:
        trace = traceback.format_exc()[-4000:]
        if reconnect.session_lost(exc):
            return _after_lost_session(job, lease, end, exc, trace)
        return end(S.ERROR, error=f"{type(exc).__name__}: {exc}", kind="exception", trace=trace)
    if ctx.ended:  # its last step ended it (``last_db_step``)
        return ctx.ended
    if ctx._child_seq or job.attempt > 1:  # it may have children (this run or an earlier one)
        expanded = _expand(job, lease, value, ctx)
        if expanded:
            return expanded, None
    return end(S.SUCCESS, result=value)


def _flushed(ctx):
    """Write the step records ``step_recorded_later`` kept before the job ends or is handed
    off (False: the lease was lost). Any other failure loses only those records: their steps
    are safe to run again."""
    if ctx is None:
        return True
    try:
        ctx.flush()
    except LeaseLost:
        return False
    except Exception:  # noqa: BLE001 (the job's end says what went wrong; this only loses a record)
        log.exception("job %s: the records of its last steps could not be written", ctx.job_id)
    return True


class _Ender:
    """End the job (lease-guarded) and optionally claim the next, in one locked transaction."""

    OUTCOME = {S.SUCCESS: "success", S.ERROR: "error", S.CANCELED: "canceled"}

    def __init__(self, job, lease, claim_until):
        """``claim_until``: a monotonic deadline for claiming the next job, or None (do not)."""
        self.job, self.lease, self.claim_until = job, lease, claim_until
        self.ctx = None  # the run's JobContext, once it has one

    def __call__(self, status, trace=None, **fields):
        """``trace``: a traceback for the staff-only log, written only if the job was still ours."""
        if not _flushed(self.ctx):
            return "lost", None
        with transaction.atomic(), transitions.batched():
            return self.locked(QueueSettings.lock(), status, trace=trace, **fields)

    def locked(self, queue, status, trace=None, where=None, then=None, **fields):
        """``__call__`` in the caller's transaction, which holds ``queue`` (the locked row).
        ``where``: more conditions on the job's row; ``then(job)``: called with the ended job
        before its end is logged (only if it was still ours)."""
        from jobs import dispatcher

        done = transitions.finish(
            self.job.id,
            self.lease.token,
            status,
            locked=True,
            reason=self.job.reason,
            where={"attempt": self.lease.generation, **(where or {})},
            trace=trace,
            then=then,
            **fields,
        )
        claim = None
        if done and self.claim_until and time.monotonic() < self.claim_until:
            claim = dispatcher.claim_locked(queue) or False
        return (self.OUTCOME[status] if done else "lost"), claim


def _note_execution(job):
    """The execution layer's entry in the reason trail (once per job).

    Kept in memory (children submitted now inherit it) and written with the next step
    record or the job's end, which are writes anyway.
    """
    source = f"vclmgr:opcode:{job.opcode}"
    if not any(item[0] == source for item in job.reason):
        job.reason = [*job.reason, reasons.entry(source, "executed")]


def _expand(job, lease, value, ctx):
    """If the job submitted children: wait for them ("expanded"); None when it has none."""
    if not _flushed(ctx):
        return "lost"
    with transaction.atomic(), transitions.batched():
        QueueSettings.lock()
        children = Job.objects.filter(parent_id=job.id).count()
        if not children:
            return None
        updated = transitions.update(
            lease.held(),
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


def _after_lost_session(job, lease, end, exc, trace):
    """The job's database session died under a step (a restarted server, ``pg_terminate_backend``,
    a cut link): the transaction it was in rolled back whole and its steps are safe to run
    again, so it goes back to the queue at once, as a lost worker's job does when its lease
    runs out (`transitions.recover`), rather than failing on the database's fault. Its kept
    step records are not written then: the steps find their work done when they run again.
    With no attempt left it ends in error, as any failed step does."""
    connection.close()  # what follows gets a fresh session
    log.warning("job %s: its database session was lost (%s); back to the queue", job.id, exc)
    error = f"{type(exc).__name__}: {exc}"
    try:
        with transaction.atomic():
            queue = QueueSettings.lock()
            if job.attempt < queue.max_attempts:
                what = f"its database session was lost ({error.strip()})"
                requeued = transitions.requeue(
                    lease.held(), job.attempt, queue.max_attempts, what, "a lost database session"
                )
                return ("retry" if requeued else "lost"), None
    except DatabaseError:  # still away: the lease runs out and the sweep resumes the job
        connection.close()
        return "lost", None
    return end(S.ERROR, error=f"{error} (attempt {job.attempt} of {queue.max_attempts})", kind="exception", trace=trace)


def _handoff(job, lease, ctx):
    if not _flushed(ctx):
        return "lost"
    grace = timedelta(seconds=settings.Q_CLUSTER["retry"])
    if not lease.held().update(lease_until=timezone.now() + grace, reason=job.reason):
        return "lost"
    transitions.log(job, "continuing in a fresh task (this one used half of the task timeout)", "debug")
    wake.continue_job(job.id, lease.token)
    return "handoff"
