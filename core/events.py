"""Emit events: the one way state changes reach browsers and API clients.

``emit()`` writes outbox rows inside the caller's transaction, so an event exists exactly
when the change it describes is committed, in whichever process made it. The relay
(``core.relay``) delivers committed rows to websocket subscribers.

Listeners, registered by kind (``"*"`` for every kind) in an app's ``AppConfig.ready()`` as
``events.LISTENERS.register(kind, events.Listener(handler))``, are called with
``(kind, data, topics, ids)`` inside that same transaction, once per emitted event: what
follows from an event (a notification, a webhook delivery, a metric) is written or counted
in one place and commits or rolls back with it. ``ids`` lists the outbox row id of each
topic when the listener asked for them (``Listener(handler, ids=True)``), else None. Listeners
must be cheap and must not fail: they run on every hot path that emits.
"""

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import connection
from django.utils import timezone

from core import bulk
from core.hooks import Hook
from core.models import Event


class Listener(NamedTuple):
    handler: Callable
    ids: bool = False  # wants the outbox row ids


LISTENERS: Hook[Listener] = Hook("core.events.LISTENERS", keyed=True)
_BY_KIND = LISTENERS.by_key  # kind or "*" -> (Listener, …): ``emit`` looks them up on its hot path
_local = threading.local()  # .sink: a batch collecting this thread's events (see ``deferred_to``)


def deferred_to(sink):
    """While set, ``emit`` hands each event to ``sink(kind, data, topics)``; a sink that returns
    True took it (and writes it before its transaction commits), False: written at once.
    ``jobs.transitions.batched`` sets it for its block. Returns the previous sink."""
    previous = getattr(_local, "sink", None)
    _local.sink = sink
    return previous


def _listeners(kind):
    return _BY_KIND.get(kind, ()) + _BY_KIND.get("*", ())


def emit(kind, data, topics):
    """Record one event under each topic; returns the rows (ids are the resume points).

    In a batch (``deferred_to``) the event is written with the batch, and no rows are returned.
    """
    sink = getattr(_local, "sink", None)
    if sink is not None and sink(kind, data, topics):
        return []
    return emit_many([(kind, data, topics)])


def emit_many(items, *, rows=True, first=None):
    """``emit`` for several ``(kind, data, topics)`` at once, in order, in one INSERT; returns the rows.

    ``rows=False``: a plain bulk INSERT (``core.bulk.insert_rows``) that reads back at most
    the ids its listeners ask for, and returns how many rows it wrote (cheaper, for hot paths
    and imports that need no rows). ``first``: other rows to insert before, as
    ``bulk.insert_rows``'s ``first`` (with ``rows=False``, in the same statement where it can).
    """
    items = [(kind, data, list(dict.fromkeys(topics))) for kind, data, topics in items]
    flat = [(kind, data, topic) for kind, data, topics in items for topic in topics]
    heard = [(item, _listeners(item[0])) for item in items] if _BY_KIND else []
    heard = [(item, entries) for item, entries in heard if entries]
    ids = any(wants for _, entries in heard for _, wants in entries)
    if rows or (ids and not connection.features.can_return_rows_from_bulk_insert):  # (SQLite < 3.35)
        if first:
            bulk.insert_rows(*first)
        created = Event.objects.bulk_create([Event(topic=topic, kind=kind, data=data) for kind, data, topic in flat])
        _tell(heard, items, [row.id for row in created])
        return created if rows else len(created)
    now = timezone.now()
    written = bulk.insert_rows(
        Event,
        ["created", "topic", "kind", "data"],
        [(now, topic, kind, data) for kind, data, topic in flat],
        returning="id" if ids else None,
        first=first,
    )
    _tell(heard, items, written if ids else None)
    return len(flat)


def _tell(heard, items, ids):
    if not heard:
        return
    offsets, at = {}, 0
    for item in items:
        offsets[id(item)] = at
        at += len(item[2])
    for item, entries in heard:
        kind, data, topics = item
        start = offsets[id(item)]
        row_ids = ids[start : start + len(topics)] if ids is not None else None
        for handler, wants in entries:
            handler(kind, data, topics, row_ids if wants else None)


def since(topics, after_id, limit=1000, through=None):
    """Committed events for these topics after ``after_id`` (up to ``through``), oldest first."""
    rows = Event.objects.filter(topic__in=list(topics), id__gt=after_id)
    if through is not None:
        rows = rows.filter(id__lte=through)
    return list(rows.order_by("id")[:limit])


def prune(days=None):
    """Delete events older than the retention period; returns how many."""
    cutoff = timezone.now() - timedelta(days=days or settings.EVENTS_RETENTION_DAYS)
    deleted, _ = Event.objects.filter(created__lt=cutoff).delete()
    return deleted
