"""Wake workers: enqueue django-q2 tasks. Kept apart so tests can replace it.

A ``run_next`` task is a token: whoever runs it claims the best startable job, runs it,
and keeps claiming while work is eligible. Tokens are topped up, not piled up: a new job
enqueues one only when none is waiting in the broker, and a worker that sees more
startable jobs than tokens adds some (at most one per local worker process). A surplus
token costs one query; a missing one is made up by the janitor within seconds.
"""

import logging
import time

from django.conf import settings
from django.db import transaction
from django_q.brokers import get_broker
from django_q.tasks import async_task

log = logging.getLogger(__name__)

RUN_NEXT = "provisioning.jobs.tasks.run_next"
RUN_JOB = "provisioning.jobs.tasks.run_job"
MAX_KICK = 256
_cached_size = (0.0, 0)  # (monotonic time, size)


def local_workers():
    return settings.Q_CLUSTER["workers"]


def kick(n=1):
    """Enqueue ``n`` run_next tokens."""
    n = max(0, min(int(n), MAX_KICK))
    if not n:
        return
    try:
        # Inside a transaction: django-q2's ORM broker closes the database connection on
        # every enqueue made in autocommit mode, which costs a reconnect each time.
        with transaction.atomic():
            for _ in range(n):
                async_task(RUN_NEXT, save=False, group="jobs")
    except Exception:  # the broker is down: the janitor wakes workers when it is back
        log.exception("could not enqueue a job token")


def top_up(wanted, max_age=0.0):
    """Make sure about ``wanted`` tokens wait in the broker (a cached size up to max_age s old)."""
    global _cached_size
    wanted = min(int(wanted), local_workers(), MAX_KICK)
    if wanted <= 0:
        return 0
    at, size = _cached_size
    if time.monotonic() - at > max_age:
        size = queue_size()
    missing = wanted - size
    if missing > 0:
        kick(missing)
        size += missing
    _cached_size = (time.monotonic(), size)
    return max(0, missing)


def after_commit(n=1):
    """Wake workers once the current transaction (which made n jobs startable) commits."""
    transaction.on_commit(lambda: top_up(n))


def continue_job(job_id, token):
    """Hand a running job to a fresh task (it outlasted half the django-q2 task timeout)."""
    with transaction.atomic():
        async_task(RUN_JOB, job_id, token, save=False, group="jobs")


def queue_size():
    try:
        with transaction.atomic():  # see kick()
            return get_broker().queue_size() or 0
    except Exception:
        log.exception("could not read the broker's queue size")
        return 0
