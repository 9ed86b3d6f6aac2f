"""Core models: the event outbox and the change log.

The app's label stays ``vclmgr`` (its tables, content types and migration history are older
than the folder). API tokens, roles and sign-on identities are the accounts app's."""

from django.conf import settings
from django.db import models


class Event(models.Model):
    """One state change, written in the same transaction as the change itself (outbox).

    A relay in each ASGI process reads new rows and forwards them to the websockets
    subscribed to ``topic``; a reconnecting client asks for rows after its last ``id``.
    """

    created = models.DateTimeField(auto_now_add=True, db_index=True)
    topic = models.CharField(max_length=100)
    kind = models.CharField(max_length=100)
    data = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["topic", "id"], name="event_topic_id")]

    def __str__(self):
        return f"#{self.id} {self.topic} {self.kind}"

    def as_message(self):
        return {
            "id": self.id,
            "topic": self.topic,
            "kind": self.kind,
            "time": self.created.isoformat(),
            "data": self.data,
        }


class ObjectChange(models.Model):
    """Who changed what, when and why: written by services (web, API, CLI and jobs alike)."""

    ACTIONS = [("create", "create"), ("update", "update"), ("delete", "delete"), ("state", "state change")]

    time = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor = models.CharField(max_length=150, help_text="user name, or 'cli', 'job 12', 'system'")
    action = models.CharField(max_length=10, choices=ACTIONS)
    content_type = models.ForeignKey("contenttypes.ContentType", on_delete=models.CASCADE)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200)
    changes = models.JSONField(default=dict, blank=True, help_text="field: [old, new]")
    reason = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["content_type", "object_id", "-time"], name="objectchange_object")]
        ordering = ["-time", "-id"]

    def __str__(self):
        return f"{self.time:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.object_repr}"
