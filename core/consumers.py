"""``/ws/events/``: authenticated, per-topic-authorised live events with resume.

Protocol (JSON text frames):
  client → {"action": "subscribe", "topics": ["user.5"], "since": 1234}   since optional
  server → {"type": "subscribed", "topics": [...], "denied": [...], "last_id": N}
  server → {"type": "event", "id": …, "topic": …, "kind": …, "time": …, "data": {…}}
  client → {"action": "unsubscribe", "topics": [...]}
``?topics=a,b&since=N`` in the URL subscribes at connect. Events after ``since`` are
replayed from the outbox first, so a reconnecting client misses nothing.

Live events come from this process's relay (``core.relay``), not from a channel layer: the
relay calls a sink that queues them, and one task per socket sends them in order. Replay and
live delivery take turns under a lock, and ids already sent are skipped, so a client gets each
event once, replayed ones before live ones.
"""

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from core import events, metrics, topics
from core.hooks import Hook
from core.relay import _max_id, relay

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
MAX_TOPICS = 50
# ``is_live(token_id) -> bool``: does the API token a socket was opened with still work? The
# accounts app fills it at start-up; without one, such a socket closes at its first check.
TOKEN_CHECK: Hook[Callable[[int], bool]] = Hook("core.consumers.TOKEN_CHECK", single=True)


def _token_is_live(token_id):
    is_live = TOKEN_CHECK.one()
    return is_live is not None and is_live(token_id)


class EventConsumer(AsyncJsonWebsocketConsumer):
    channel_layer_alias = None  # no layer: events arrive through the relay's sink

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # Accept, then close with an application code: a browser sees why and stops
            # reconnecting (a refused handshake looks like a network error).
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.baseline = {}  # topic -> last id the client already has
        self.recent = deque(maxlen=2000)
        self.recent_set = set()
        self.mailbox = asyncio.Queue()  # unbounded: the relay never waits for, nor drops, an event
        self.sink = self.mailbox.put_nowait
        self.turn = asyncio.Lock()  # replay and live delivery, one at a time
        self.pump = asyncio.get_running_loop().create_task(self._pump())
        if "api_token_id" in self.scope:
            self.token_watch = asyncio.get_running_loop().create_task(self._watch_token(self.scope["api_token_id"]))
        await self.accept()
        self.counted = True
        metrics.WS_CLIENTS.inc()
        query = parse_qs(self.scope.get("query_string", b"").decode())
        wanted = [t for value in query.get("topics", []) for t in value.split(",") if t]
        if wanted:
            await self.subscribe(wanted, _parse_since(query.get("since", [None])[0]))

    async def disconnect(self, code):
        if getattr(self, "counted", False):
            self.counted = False
            metrics.WS_CLIENTS.dec()
        for topic in list(getattr(self, "baseline", {})):
            self._leave(topic)
        if hasattr(self, "pump"):
            self.pump.cancel()
        if hasattr(self, "token_watch"):
            self.token_watch.cancel()

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "message": "expected a JSON object"})
            return
        action = content.get("action")
        wanted = content.get("topics")
        if action not in {"subscribe", "unsubscribe"} or not isinstance(wanted, list):
            usage = "expected {action: subscribe|unsubscribe, topics: [...]}"
            await self.send_json({"type": "error", "message": usage})
            return
        wanted = [t for t in wanted if isinstance(t, str)]
        if action == "subscribe":
            await self.subscribe(wanted, _parse_since(content.get("since")))
        else:
            for topic in wanted:
                if topic in self.baseline:
                    self._leave(topic)
            await self.send_json({"type": "unsubscribed", "topics": wanted})

    async def subscribe(self, wanted, since):
        allowed, denied, latest = await database_sync_to_async(_authorise)(self.scope["user"], wanted[:MAX_TOPICS])
        start = latest if since is None else since
        fresh = [t for t in allowed if t not in self.baseline]
        async with self.turn:
            for topic in fresh:
                self.baseline[topic] = start
                await relay.subscribe(topic, self.sink)
            await self.send_json({"type": "subscribed", "topics": allowed, "denied": denied, "last_id": latest})
            if fresh:
                # Also without ``since``: what was committed between reading ``latest`` and
                # the relay taking over is read here, not lost. Only up to what the relay has
                # handed on: newer rows reach this socket live, in id order, so the client's
                # newest id stays a safe resume point.
                through = relay.delivered_through
                for event in await database_sync_to_async(events.since)(fresh, start, through=through):
                    await self._deliver(event.as_message())

    async def _pump(self):
        while True:
            event = await self.mailbox.get()
            async with self.turn:
                try:
                    await self._deliver(event)
                except Exception:  # keep the socket's stream going; the client can resume
                    log.exception("sending an event failed")

    async def _watch_token(self, token_id):
        # A revoked or expired token ends the stream it opened (within one period).
        while True:
            await asyncio.sleep(settings.WS_TOKEN_RECHECK_SECONDS)
            if not await database_sync_to_async(_token_is_live)(token_id):
                await self.close(code=CLOSE_UNAUTHENTICATED)
                return

    async def _deliver(self, event):
        topic, event_id = event["topic"], event["id"]
        if topic not in self.baseline or event_id <= self.baseline[topic] or event_id in self.recent_set:
            return
        if len(self.recent) == self.recent.maxlen:
            self.recent_set.discard(self.recent[0])
        self.recent.append(event_id)
        self.recent_set.add(event_id)
        await self.send_json({"type": "event", **event})

    def _leave(self, topic):
        self.baseline.pop(topic, None)
        relay.unsubscribe(topic, self.sink)


def _authorise(user, wanted):
    """Allowed and denied topics, and the newest event id: one trip to the database thread."""
    allowed, denied = [], []
    for topic in wanted:
        (allowed if topics.may_subscribe(user, topic) else denied).append(topic)
    return allowed, denied, _max_id()


def _parse_since(value):
    try:
        return None if value is None else max(0, int(value))
    except (TypeError, ValueError):
        return None
