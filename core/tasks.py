"""Background tasks of the core app (run by django-q2 workers)."""

import os

from django.db import transaction

from core import events


def ping(topic="admin"):
    """Emit ``worker.pong`` from a worker process: proves the queue and the event path work."""
    with transaction.atomic():
        events.emit("worker.pong", {"pid": os.getpid()}, [topic])
    return os.getpid()


def prune_events():
    return events.prune()
