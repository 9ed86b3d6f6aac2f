"""Which job runs next: a pure ``plan()`` and the race-free ``claim_next()`` around it.

``plan`` walks pending jobs in priority order (higher first; within a priority, submitters
take turns: each one's first job, then each one's second, …; then submission order) and
starts one only when
  * each dependency ended in an accepted status (one that ended otherwise fails the job),
  * none of its locks conflicts with a running job's, nor with the locks of an earlier job
    already waiting for them (first come, first served: no starvation of exclusive locks),
  * every rate-limit bucket of its reason trail has fewer than N jobs running,
  * the global limit has room.
Jobs planned to start count as running for the jobs after them.

The scan reads only jobs whose dependencies have all ended (``runnable``): jobs waiting for
a dependency stay ``waiting`` and out of it, so however many of them there are they never
hide a job that could start (the scan stops after ``SCAN_LIMIT`` rows).

``claim_next`` runs the plan inside one transaction holding the queue lock and flips the
first startable job to ``running`` with a fresh lease token (a conditional UPDATE on its
pending status): many worker processes may call it at once, on SQLite or PostgreSQL, and
the limit, buckets and locks still hold.
"""

import json
import os
import socket
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q, Subquery, Value, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from jobs import transitions
from jobs.locks import LockTable
from jobs.models import Job, JobDependency, QueueSettings, update_returning
from jobs.reasons import label

S = Job.Status
CHUNK = 50
SCAN_LIMIT = 500  # candidates examined per claim; the rest wait for the next one


@dataclass
class Candidate:
    id: int
    status: str = "queued"
    locks: list = field(default_factory=list)
    buckets: list = field(default_factory=list)
    deps: list = field(default_factory=list)  # [(job id, its status, accepted statuses)]
    waiting_for: str = ""
    attempt: int = 0  # attempts so far (0: never started)


@dataclass
class Running:
    id: int
    locks: list = field(default_factory=list)
    buckets: list = field(default_factory=list)


@dataclass
class Plan:
    start: list = field(default_factory=list)  # ids, in the order to start them
    blocked: dict = field(default_factory=dict)  # id -> (status, waiting_for)
    failed: dict = field(default_factory=dict)  # id -> message (a dependency ended badly)


class Planner:
    """Incremental ``plan``: feed candidates in order until ``full``."""

    def __init__(self, running, limit):
        self.limit = limit
        self.room = limit - len(running)
        self.held = LockTable()
        self.reserved = LockTable()
        self.in_bucket = Counter()
        for job in running:
            self._take(job)
        self.plan = Plan()

    def _take(self, job):
        self.held.add(job.id, job.locks)
        self.in_bucket.update(key for key, _ in job.buckets)

    @property
    def full(self):
        return self.room <= 0

    def consider(self, c):
        waiting = self._dependency_wait(c)
        if c.id in self.plan.failed:
            return
        if waiting is None:
            waiting = self._lock_wait(c)
        if waiting is not None:
            self.plan.blocked[c.id] = (S.WAITING, waiting)
            return
        full = [(key, n) for key, n in c.buckets if self.in_bucket[key] >= n]
        if full:
            key, n = full[0]
            self.plan.blocked[c.id] = (S.QUEUED, f"rate-limit bucket {label(key)!r}: {n} of {n} running")
        elif self.room <= 0:
            self.plan.blocked[c.id] = (S.QUEUED, f"global limit: {self.limit} running")
        else:
            self.plan.start.append(c.id)
            self.room -= 1
            self._take(c)

    def _dependency_wait(self, c):
        unfinished = []
        for dep_id, dep_status, accepted in c.deps:
            if dep_status in Job.FINAL:
                if accepted and dep_status not in accepted:
                    self.plan.failed[c.id] = (
                        f"dependency job {dep_id} ended {dep_status}; accepted: {', '.join(accepted)}"
                    )
                    return None
            else:
                unfinished.append(f"job {dep_id} ({dep_status})")
        if unfinished:
            more = f" and {len(unfinished) - 1} more" if len(unfinished) > 1 else ""
            return f"dependency: {unfinished[0]}{more}"
        return None

    def _lock_wait(self, c):
        if not c.locks:
            return None
        conflict = self.held.conflict(c.locks)
        if conflict:
            name, holders = conflict
            self.reserved.add(c.id, c.locks)
            return f"lock {name} held by " + ", ".join(f"job {h}" for h in holders[:3])
        conflict = self.reserved.conflict(c.locks)
        self.reserved.add(c.id, c.locks)
        if conflict:
            name, holders = conflict
            return f"lock {name}: in line behind job {holders[0]}"
        return None


def plan(candidates, running, limit):
    """The pure decision (see module doc); candidates in priority order."""
    planner = Planner(running, limit)
    for candidate in candidates:
        planner.consider(candidate)
    return planner.plan


HOST = socket.gethostname()


def runner_label():
    """Who runs a job: ``host:pid`` of the worker process."""
    return f"{HOST}:{os.getpid()}"


def pending():
    """Jobs that may still start, best first."""
    return Job.objects.filter(status__in=Job.PENDING, awaiting_children=False).order_by("-priority", "id")


def runnable():
    """The first ``SCAN_LIMIT`` pending jobs (by priority, then age) whose dependencies all
    ended (one that ended badly fails the job in the plan), in the plan's order: by
    priority, submitters taking turns within one. Turns are counted over those rows only,
    so the cost stays that of a few hundred rows however long the queue."""
    unfinished = JobDependency.objects.filter(job=OuterRef("pk")).exclude(on__status__in=Job.FINAL)
    head = (
        Job.objects.filter(status__in=Job.PENDING, awaiting_children=False)
        .filter(Q(has_deps=False) | ~Exists(unfinished))
        .order_by("-priority", "id")
        .values("pk")[:SCAN_LIMIT]
    )
    turn = Window(RowNumber(), partition_by=[F("priority"), F("submitter_id")], order_by=F("id").asc())
    return Job.objects.filter(pk__in=Subquery(head)).annotate(turn=turn).order_by("-priority", "turn", "id")


_compiled = {}


def _fetch(key, build):
    """Rows of a query of fixed shape, its SQL compiled once per process and database vendor.

    Django compiles a queryset on every evaluation; on the claim path (once per job) that
    cost more than running these small queries. ``build()``: the queryset, or ``(sql, params)``.
    """
    sql = _compiled.get((connection.vendor, key))
    if sql is None:
        built = build()
        sql = _compiled[(connection.vendor, key)] = built if isinstance(built, tuple) else built.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(*sql)
        return cursor.fetchall()


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


PENDING_FIELDS = ("id", "status", "locks", "buckets", "waiting_for", "has_deps", "attempt")


def _pending(offset, size):
    rows = _fetch(("pending", offset, size), lambda: runnable().values_list(*PENDING_FIELDS)[offset : offset + size])
    return _pending_rows(rows)


def _first_page(size):
    """``_running()`` and ``_pending(0, size)`` in one statement (a claim reads both, every time).
    Pending rows are put in the plan's order here (by priority, turn, id), not by the UNION."""

    def build():
        running = Job.objects.filter(status=S.RUNNING).annotate(turn=Value(0))
        pending = runnable()[:size]
        parts = [
            rows.values_list(*PENDING_FIELDS, "priority", "turn").query.sql_with_params() for rows in (running, pending)
        ]
        return (
            f"SELECT * FROM ({parts[0][0]}) AS r UNION ALL SELECT * FROM ({parts[1][0]}) AS p",
            (*parts[0][1], *parts[1][1]),
        )

    rows = _fetch(("first", size), build)
    running = [Running(row[0], _json(row[2]), _json(row[3])) for row in rows if row[1] == S.RUNNING]
    pending = sorted((row for row in rows if row[1] != S.RUNNING), key=lambda row: (-row[7], row[8], row[0]))
    return running, _pending_rows([row[:7] for row in pending])


def _pending_rows(rows):
    return [
        {
            "id": i,
            "status": st,
            "locks": _json(lk),
            "buckets": _json(bk),
            "waiting_for": wf,
            "has_deps": bool(hd),
            "attempt": attempt,
        }
        for i, st, lk, bk, wf, hd, attempt in rows
    ]


def _candidates(rows):
    ids = [row["id"] for row in rows if row["has_deps"]]
    deps = {}
    if ids:
        found = JobDependency.objects.filter(job_id__in=ids).values_list("job_id", "on_id", "on__status", "accepted")
        for job_id, on_id, on_status, accepted in found:
            deps.setdefault(job_id, []).append((on_id, on_status, accepted or []))
    return [
        Candidate(
            id=row["id"],
            status=row["status"],
            locks=row["locks"],
            buckets=row["buckets"],
            deps=deps.get(row["id"], []),
            waiting_for=row["waiting_for"],
            attempt=row["attempt"],
        )
        for row in rows
    ]


def evaluate(limit):
    """Run the planner over pending jobs until the limit is full; returns (planner, candidates by id)."""
    # The first read, with the running jobs, is sized to the limit (plus a few that may be
    # blocked): with a long queue and a small limit, reading CHUNK rows per claim was most of
    # its cost.
    size = min(CHUNK, max(0, limit) + 4)
    running, rows = _first_page(size)
    planner = Planner(running, limit)
    seen = {}
    offset = 0
    while offset < SCAN_LIMIT and not planner.full:
        if offset:
            rows = _pending(offset, size)
        for candidate in _candidates(rows):
            seen[candidate.id] = candidate
            planner.consider(candidate)
            if planner.full:
                break
        if len(rows) < size:
            break
        offset += size
        size = CHUNK
    return planner, seen


def eligible_count():
    """How many pending jobs could start now (read-only; for deciding whether to wake workers)."""
    limit = QueueSettings.get().limit
    planner, _ = evaluate(limit)
    return len(planner.plan.start)


@dataclass
class Claim:
    id: int
    token: str
    more: int  # further jobs startable right now
    job: Job = None
    lease_seconds: int = 30


def claim_next(runner=None):
    """Claim the best startable job for this worker, or None. Race-free across processes."""
    if not pending().exists():
        return None
    with transaction.atomic(), transitions.batched():
        return claim_locked(QueueSettings.lock(), runner)


# What a worker needs of the job it claims (the rest, e.g. ``result``, stays unread).
CLAIM_FIELDS = [
    *transitions.LEAN_FIELDS,
    "params",
    "reason",
    "steps",
    "runner",
    "lease_token",
    "lease_until",
]


def claim_locked(queue, runner=None):
    """``claim_next`` for a caller that holds the queue lock (``queue`` is the locked row)."""
    with transaction.atomic(savepoint=False), transitions.batched():
        planner, seen = evaluate(queue.limit)
        result = planner.plan
        for job_id, message in result.failed.items():
            failed = transitions.end_pending(job_id, S.ERROR, kind="dependency", message=message)
            if failed:
                transitions.settle(failed)
        _update_blocked(result.blocked, seen)
        if not result.start:
            return None
        job_id = result.start[0]
        now = timezone.now()
        token = uuid.uuid4().hex
        # Literal values, not F() expressions (the statement compiles in half the time); the
        # attempt read under the queue lock is part of the condition all the same.
        attempt = seen[job_id].attempt
        first = {"started": now} if attempt == 0 else {}
        claimed = update_returning(
            Job.objects.filter(pk=job_id, status__in=Job.PENDING, awaiting_children=False, attempt=attempt),
            CLAIM_FIELDS,
            status=S.RUNNING,
            lease_token=token,
            lease_until=now + timedelta(seconds=queue.lease_seconds),
            runner=(runner or runner_label())[:120],
            attempt=attempt + 1,
            waiting_for="",
            cancel_requested=False,
            **first,
        )
        if not claimed:  # cannot happen under the queue lock; be safe anyway
            return None
        job = claimed[0]
        resumed = f", resuming after {len(job.steps)} completed steps" if job.steps else ""
        transitions.log(job, f"started on {job.runner} (attempt {job.attempt}){resumed}")
        transitions.emit_status(job)
        return Claim(id=job_id, token=token, more=len(result.start) - 1, job=job, lease_seconds=queue.lease_seconds)


def _update_blocked(blocked, seen):
    """Write the new status / waiting_for of blocked jobs that changed, and emit them."""
    for job_id, (status, waiting_for) in blocked.items():
        before = seen.get(job_id)
        if before is not None and before.status == status and before.waiting_for == waiting_for:
            continue
        job = transitions.update(
            Job.objects.filter(pk=job_id, status__in=Job.PENDING), status=status, waiting_for=waiting_for[:300]
        )
        if job is not None:
            transitions.announce(job)
