"""Emit events: the one way state changes reach browsers and API clients.

``emit()`` writes outbox rows inside the caller's transaction, so an event exists exactly
when the change it describes is committed, in whichever process made it. The relay
(``vclmgr.relay``) delivers committed rows to websocket subscribers.
"""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from vclmgr import bulk
from vclmgr.models import Event


def emit(kind, data, topics):
    """Record one event under each topic; returns the rows (ids are the resume points)."""
    return emit_many([(kind, data, topics)])


def emit_many(items, *, rows=True):
    """``emit`` for several ``(kind, data, topics)`` at once, in order, in one INSERT; returns the rows.

    ``rows=False``: a plain bulk INSERT (``vclmgr.bulk.insert_rows``) that reads nothing back
    and returns how many rows it wrote (cheaper, for hot paths and imports that need no ids).
    """
    flat = [(kind, data, topic) for kind, data, topics in items for topic in dict.fromkeys(topics)]
    if rows:
        return Event.objects.bulk_create([Event(topic=topic, kind=kind, data=data) for kind, data, topic in flat])
    if flat:
        now = timezone.now()
        bulk.insert_rows(
            Event, ["created", "topic", "kind", "data"], [(now, topic, kind, data) for kind, data, topic in flat]
        )
    return len(flat)


def since(topics, after_id, limit=1000):
    """Committed events for these topics after ``after_id``, oldest first."""
    return list(Event.objects.filter(topic__in=list(topics), id__gt=after_id).order_by("id")[:limit])


def prune(days=None):
    """Delete events older than the retention period; returns how many."""
    cutoff = timezone.now() - timedelta(days=days or settings.EVENTS_RETENTION_DAYS)
    deleted, _ = Event.objects.filter(created__lt=cutoff).delete()
    return deleted
