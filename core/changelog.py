"""The change log: services call ``record()`` for every write they make.

Written explicitly by the service (not by signals), so changes made from the CLI or by a
job are logged as faithfully as those made in the browser. ``Actor`` says who acted.
``record_many()`` writes the same rows for a batch (the bulk import) in bulk, inside the
caller's transaction just as ``record()`` does.
"""

import threading
from dataclasses import dataclass

from django.contrib.contenttypes.models import ContentType
from django.utils import timezone

from core import bulk
from core.models import ObjectChange

_local = threading.local()  # .sink: a batch collecting this thread's rows (see ``deferred_to``)

SECRET_FIELDS = {"secret", "password", "encrypted_secret"}


@dataclass(frozen=True)
class Actor:
    """Who does something: a user, or a named system part ('cli', 'job 12', 'demo')."""

    user: object = None
    name: str = ""

    @property
    def label(self):
        if self.user is not None:
            return self.user.get_username()
        return self.name or "system"

    @classmethod
    def of(cls, user_or_name):
        if isinstance(user_or_name, cls):
            return user_or_name
        if isinstance(user_or_name, str) or user_or_name is None:
            return cls(name=user_or_name or "system")
        return cls(user=user_or_name if user_or_name.is_authenticated else None)


SYSTEM = Actor(name="system")


def diff(before, after, fields):
    """{field: [old, new]} for the fields whose value differs (secrets masked)."""
    changes = {}
    for field in fields:
        old, new = before.get(field), after.get(field)
        if old != new:
            changes[field] = ["***", "***"] if field in SECRET_FIELDS else [_plain(old), _plain(new)]
    return changes


def _plain(value):
    if value is None or isinstance(value, (bool, int, float, str, list, dict)):
        return value
    return str(value)


def _row(obj, action, actor, changes, reason):
    """The columns of one change-log row (``actor`` an ``Actor``), by attribute name."""
    return {
        "user_id": actor.user.pk if actor.user is not None else None,
        "actor": actor.label[:150],
        "action": action,
        "content_type_id": ContentType.objects.get_for_model(type(obj)).pk,
        "object_id": str(obj.pk),
        "object_repr": str(obj)[:200],
        "changes": changes or {},
        "reason": reason or "",
    }


def record(obj, action, actor, changes=None, reason=""):
    """One change-log row; in a batch (``deferred_to``) written with the batch (returns None)."""
    row = _row(obj, action, Actor.of(actor), changes, reason)
    sink = getattr(_local, "sink", None)
    if sink is not None and sink(row):
        return None
    return ObjectChange.objects.create(**row)


def deferred_to(sink):
    """While set, ``record`` hands each row's columns to ``sink(columns)``; True: it took the
    row (and writes it with ``write_rows`` before its transaction commits). Returns the previous."""
    previous = getattr(_local, "sink", None)
    _local.sink = sink
    return previous


def write_rows(rows):
    """INSERT change-log rows (columns as ``record`` makes them), all at this time, in one statement."""
    if rows:
        bulk.insert_rows(*insert_of(rows))


def insert_of(rows):
    """``core.bulk.insert_rows``'s arguments for change-log rows (columns as ``record`` makes
    them), all at this time (``write_rows``; a batch hands them to ``events.emit_many``)."""
    now = timezone.now()
    return ObjectChange, ["time", *rows[0]], [(now, *row.values()) for row in rows]


def record_many(entries, *, actor, reason=""):
    """``record`` for each ``(obj, action, changes)``, by one actor for one reason, in bulk.

    The rows are those ``record`` writes, all with the same time; returns how many.
    """
    actor = Actor.of(actor)
    rows = [_row(obj, action, actor, changes, reason) for obj, action, changes in entries]
    write_rows(rows)
    return len(rows)


def history(obj, limit=100):
    return ObjectChange.objects.filter(
        content_type=ContentType.objects.get_for_model(type(obj)), object_id=str(obj.pk)
    ).select_related("user")[:limit]
