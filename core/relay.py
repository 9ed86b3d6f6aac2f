"""The outbox relay: one per ASGI process, it forwards committed events to that process's sockets.

Why polling: events are written by any process (web, workers, CLI), and the in-memory
channel layer only reaches its own process. Reading the outbox table by primary key every
``EVENTS_POLL_SECONDS`` works the same on SQLite and PostgreSQL, with or without Redis.

Why not through the channel layer: each process's relay serves only the sockets of its own
process, so a layer would be a mailbox inside one process at a high price: the in-memory
layer scans every channel and group on each group send and drops messages past 100 queued
per channel, and with Redis every event makes round trips per socket and group membership
expires after a day. Consumers register a sink per topic (``subscribe``) and the relay calls
it with each committed event of that topic; sinks must not block (a consumer queues it).

Ids are assigned at insert but committed in any order, so a row with a smaller id may
appear after a larger one was read: the relay remembers the ids below its high-water mark
it has not seen yet (gaps) and asks for them on each poll, for ``GAP_KEEP_SECONDS`` — by
time, not by a count of ids: under load a few hundred events commit in the seconds a slow
transaction takes, and a window of ids would give up on its events before they commit.
It hands rows on in id order: a row waits behind a gap younger than ``ORDER_WAIT`` seconds
(a transaction still committing), so a client's newest id is a safe resume point
(``since``) — resuming from it on another web machine loses no event committed late. A gap
older than that is taken for a rolled-back insert: rows behind it go on, and if it commits
after all it is still handed on (late, out of order). ``delivered_through`` is the id up to
which rows have been handed on; a subscriber replays from the outbox up to it only
(``events.since(..., through=)``), and the rest reaches it live.

Contract for a subscriber: once ``await relay.subscribe(topic, sink)`` returns, every event
of ``topic`` committed from then on reaches ``sink`` (within ``GAP_KEEP_SECONDS`` of its id); what
was committed before, the subscriber reads from the outbox itself (``events.since``).
"""

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Q

from core.models import Event

log = logging.getLogger(__name__)

LOOKBACK = 500  # at the start: ids below the high-water mark still awaited (mostly long gone)
GAP_KEEP_SECONDS = 600.0  # a skipped id is awaited this long: a transaction open longer is lost to sockets
MAX_GAPS = 20_000  # the newest kept beyond that (rolled-back ids pile up only under faults)
BATCH = 5000  # rows read per poll at most
ORDER_WAIT = 2.0  # seconds a row waits behind a smaller id not committed yet


class Relay:
    def __init__(self):
        self.high_water = None  # every id up to here was read, except the gaps
        self.gaps = set()
        self.gap_seen = {}  # gap id -> when it was first seen (clock seconds)
        self.held = {}  # id -> row read but waiting behind a young gap
        self.delivered_through = 0  # rows up to this id were handed on (or are given up gaps)
        self.clock = time.monotonic
        self.settled = False  # a poll has read rows since the start
        self.subscribers = {}  # topic -> {sink: None}, an ordered set of callables
        self.task = None
        self._starting = asyncio.Lock()

    async def subscribe(self, topic, sink):
        self.subscribers.setdefault(topic, {})[sink] = None
        await self.ensure_running()

    def unsubscribe(self, topic, sink):
        sinks = self.subscribers.get(topic, {})
        sinks.pop(sink, None)
        if not sinks:
            self.subscribers.pop(topic, None)

    async def ensure_running(self):
        """Start polling; returns once the starting point is read, so nothing after it is missed."""
        if self.high_water is not None and self.task is not None and not self.task.done():
            return
        async with self._starting:
            if self.high_water is None:
                self.high_water, self.gaps = await database_sync_to_async(_starting_point)()
                # Ids missing at the start are mostly long gone (rolled back, pruned): no wait.
                self.gap_seen = dict.fromkeys(self.gaps, self.clock() - ORDER_WAIT)
                self.delivered_through = self._barrier()
            if self.task is None or self.task.done():
                self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self):
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a database hiccup must not end live updates for good
                log.exception("event relay poll failed")
            await asyncio.sleep(settings.EVENTS_POLL_SECONDS)

    async def poll_once(self):
        # Not in the thread shared by every consumer's queries: a burst of (re)connecting
        # sockets must not hold up the events of those already connected.
        read = database_sync_to_async(_rows_after, thread_sensitive=False)
        rows = await read(self.high_water, sorted(self.gaps))
        self.advance([row["id"] for row in rows])
        self.held.update((row["id"], row) for row in rows)
        barrier = self._barrier()
        ready = sorted(i for i in self.held if i <= barrier)
        self.delivered_through = barrier
        for row in (self.held.pop(i) for i in ready):
            for sink in list(self.subscribers.get(row["topic"], ())):
                try:
                    sink(row)
                except Exception:  # one broken socket must not cost the others their events
                    log.exception("event sink failed")

    def advance(self, read_ids):
        """Move the high-water mark past ``read_ids``; ids skipped on the way become gaps,
        awaited for ``GAP_KEEP_SECONDS``."""
        top = max([self.high_water, *read_ids])
        skipped = range(max(self.high_water, top - MAX_GAPS) + 1, top + 1)
        # The first rows read after the start may jump over ids long gone (a pruned or new
        # table's starting point lies below the sequence): like the starting gaps, no wait.
        clock = self.clock()
        now = clock - (0 if self.settled else ORDER_WAIT)
        given_up = clock - GAP_KEEP_SECONDS
        gaps = (self.gaps | set(skipped)) - set(read_ids)
        seen = {i: self.gap_seen.get(i, now) for i in gaps}
        self.gap_seen = {i: at for i, at in seen.items() if at > given_up}
        if len(self.gap_seen) > MAX_GAPS:
            kept = sorted(self.gap_seen)[-MAX_GAPS:]
            self.gap_seen = {i: self.gap_seen[i] for i in kept}
        self.gaps = set(self.gap_seen)
        self.settled = self.settled or bool(read_ids)
        self.high_water = top

    def _barrier(self):
        """The id up to which rows may go on: below the smallest gap still young, else all read."""
        deadline = self.clock() - ORDER_WAIT
        young = [i for i, seen in self.gap_seen.items() if seen > deadline]
        return min(young) - 1 if young else self.high_water


def _max_id():
    last = Event.objects.order_by("-id").values_list("id", flat=True).first()
    return last or 0


def _starting_point():
    """The high-water mark now, and the ids below it not committed (yet)."""
    top = _max_id()
    present = set(Event.objects.filter(id__gt=top - LOOKBACK).values_list("id", flat=True))
    return top, set(range(max(0, top - LOOKBACK) + 1, top + 1)) - present


def _rows_after(after_id, gaps):
    rows = Event.objects.filter(Q(id__gt=after_id) | Q(id__in=gaps)).order_by("id")[:BATCH]
    return [event.as_message() for event in rows]


relay = Relay()
