"""Wake workers: enqueue django-q2 tasks. Kept apart so tests can replace it.

A ``run_next`` task is a token: whoever runs it claims the best startable job, runs it,
and keeps claiming while work is eligible. Tokens are topped up, not piled up: new jobs
enqueue tokens only when fewer wait in the broker than jobs are queued, and a worker
that sees more startable jobs than tokens adds some (at most one per local worker
process). Only ``run_next`` tasks count as tokens: other tasks share the broker (a
notification's ``send_due``) and wake no job. A surplus token costs one query; a missing
one is made up by the janitor within seconds, which is what a new job would wait.
"""

import logging
import os
import time
from contextlib import nullcontext

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from django_q.tasks import async_task

log = logging.getLogger(__name__)

RUN_NEXT = "jobs.tasks.run_next"
RUN_JOB = "jobs.tasks.run_job"
MAX_KICK = 256
SCAN_EXTRA = 16  # waiting tasks read beyond the tokens wanted (see waiting_tokens)
_cached_size = (0.0, 0)  # (monotonic time, tokens waiting)


def local_workers():
    return settings.Q_CLUSTER["workers"]


def _orm_broker():
    return "orm" in settings.Q_CLUSTER


_broker = (None, None)  # (pid, broker)


def broker():
    """This process's broker: django-q2 makes a new one (a new Redis client) per call otherwise."""
    global _broker
    pid = os.getpid()
    if _broker[0] != pid:
        _broker = (pid, get_broker())
    return _broker[1]


def _enqueue_guard():
    """Where to enqueue: in a transaction for the ORM broker, else as is.

    django-q2's ORM broker closes the database connection on every enqueue made in
    autocommit mode (which costs a reconnect each time); a transaction avoids that. Redis
    needs no transaction, and on SQLite an empty one would still take the write lock.
    """
    return transaction.atomic() if _orm_broker() else nullcontext()


def kick(n=1):
    """Enqueue ``n`` run_next tokens."""
    n = max(0, min(int(n), MAX_KICK))
    if not n:
        return
    try:
        with _enqueue_guard():
            for _ in range(n):
                async_task(RUN_NEXT, save=False, group="jobs", broker=broker())
    except Exception:  # the broker is down: the janitor wakes workers when it is back
        log.exception("could not enqueue a job token")


def top_up(wanted, max_age=0.0, queued=False):
    """Make sure about ``wanted`` tokens wait in the broker (a count up to max_age s old).

    ``queued``: ``wanted`` jobs were just made startable, on top of the queued jobs that
    the tokens already waiting are for. A token enqueued for a job submitted a moment ago
    (a teardown, then the next reservation's build) waits until the pusher's next poll:
    counted as the new job's, it would leave that job to the worker that claims the first
    one and only then sees a second startable (a poll later again), or to the janitor."""
    global _cached_size
    limit = min(local_workers(), MAX_KICK)
    wanted = min(int(wanted), limit)
    if wanted <= 0:
        return 0
    at, size = _cached_size
    if time.monotonic() - at > max_age:
        size = waiting_tokens(limit)
    if queued and 0 < size < limit:  # the tokens waiting may all be spoken for
        wanted = min(max(wanted, queued_count()), limit)
    missing = wanted - size
    if missing > 0:
        kick(missing)
        size += missing
    _cached_size = (time.monotonic(), size)
    return max(0, missing)


def after_commit(n=1):
    """Wake workers once the current transaction (which made n jobs startable) commits."""
    transaction.on_commit(lambda: top_up(n, queued=True))


def queued_count():
    """Queued jobs: startable, or held back by the global limit or a rate-limit bucket."""
    from jobs.models import Job

    return Job.objects.filter(status=Job.Status.QUEUED, awaiting_children=False).count()


def continue_job(job_id, token):
    """Hand a running job to a fresh task (it outlasted half the django-q2 task timeout)."""
    with _enqueue_guard():
        async_task(RUN_JOB, job_id, token, save=False, group="jobs", broker=broker())


def waiting_tokens(limit):
    """How many ``run_next`` tokens wait in the broker, counting up to ``limit`` (0 on error).

    Other tasks wait there too, and counted as tokens they left a new job without one until
    the janitor's next round. At most ``limit`` plus ``SCAN_EXTRA`` waiting tasks are read:
    past that, a surplus token costs less than reading the rest."""
    try:
        if _orm_broker():
            # The ORM broker's waiting rows (see queue_size), without its connection recycling.
            queued = OrmQ.objects.using(settings.Q_CLUSTER["orm"]).filter(key=Conf.CLUSTER_NAME)
            payloads = queued.filter(lock__lte=timezone.now()).values_list("payload", flat=True)[: limit + SCAN_EXTRA]
        else:
            found = broker()
            payloads = found.connection.lrange(found.list_key, 0, limit + SCAN_EXTRA - 1)
        tokens = 0
        for payload in payloads:
            try:
                tokens += SignedPackage.loads(payload).get("func") == RUN_NEXT
            except Exception:  # noqa: BLE001 (not a task of ours: the pusher fails it)
                continue
            if tokens >= limit:
                break
        return tokens
    except Exception:
        log.exception("could not read the broker's waiting tasks")
        return 0


def queue_size():
    try:
        if _orm_broker():
            # What the ORM broker counts, without its connection recycling (see
            # _enqueue_guard) and without a write transaction (SQLite).
            queued = OrmQ.objects.using(settings.Q_CLUSTER["orm"]).filter(key=Conf.CLUSTER_NAME)
            return queued.filter(lock__lte=timezone.now()).count()
        return broker().queue_size() or 0
    except Exception:
        log.exception("could not read the broker's queue size")
        return 0
