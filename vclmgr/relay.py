"""The outbox relay: one per ASGI process, it forwards committed events to local sockets.

Why polling: events are written by any process (web, workers, CLI), and the in-memory
channel layer only reaches its own process. Reading the outbox table by primary key every
``EVENTS_POLL_SECONDS`` works the same on SQLite and PostgreSQL, with or without Redis.

Each process sends through the channel layer to groups named with its own token, so with
Redis (a layer shared by many processes) every event is still delivered once per socket.

Ids are assigned at insert but committed in any order, so a row with a smaller id may
appear after a larger one was relayed; the relay re-reads a window below its high-water
mark and remembers which ids it already sent.
"""

import asyncio
import logging
import uuid

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from vclmgr.models import Event

log = logging.getLogger(__name__)

PROCESS_TOKEN = uuid.uuid4().hex[:12]
LOOKBACK = 500  # ids below the high-water mark re-read for late commits


def group_name(topic):
    return f"ev.{PROCESS_TOKEN}.{topic}"


class Relay:
    def __init__(self):
        self.high_water = None
        self.sent = set()
        self.subscribers = {}  # topic -> number of local subscriptions
        self.task = None

    def subscribe(self, topic):
        self.subscribers[topic] = self.subscribers.get(topic, 0) + 1
        self.ensure_running()

    def unsubscribe(self, topic):
        left = self.subscribers.get(topic, 0) - 1
        if left > 0:
            self.subscribers[topic] = left
        else:
            self.subscribers.pop(topic, None)

    def ensure_running(self):
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self):
        layer = get_channel_layer()
        while True:
            try:
                await self.poll_once(layer)
            except asyncio.CancelledError:
                raise
            except Exception:  # a database hiccup must not end live updates for good
                log.exception("event relay poll failed")
            await asyncio.sleep(settings.EVENTS_POLL_SECONDS)

    async def poll_once(self, layer):
        if self.high_water is None:
            self.high_water = await database_sync_to_async(_max_id)()
            return
        if not self.subscribers:
            return
        rows = await database_sync_to_async(_rows_after)(self.high_water - LOOKBACK)
        for row in rows:
            if row["id"] in self.sent:
                continue
            self.sent.add(row["id"])
            self.high_water = max(self.high_water, row["id"])
            if row["topic"] in self.subscribers:
                await layer.group_send(group_name(row["topic"]), {"type": "event.message", "event": row})
        floor = self.high_water - LOOKBACK
        self.sent = {i for i in self.sent if i > floor}


def _max_id():
    last = Event.objects.order_by("-id").values_list("id", flat=True).first()
    return last or 0


def _rows_after(after_id):
    return [event.as_message() for event in Event.objects.filter(id__gt=after_id).order_by("id")[:5000]]


relay = Relay()
