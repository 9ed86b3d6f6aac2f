"""A per-process placement engine kept close to the database, cheaply.

Loading every host and allocation costs seconds at 10,000 hosts, far too slow per claim.
Each process keeps one engine and brings it up to date before each decision: new
allocations (by id, re-reading a window below the high-water mark for late commits) and
released ones (by release time) are applied incrementally; a change to any host, host tag
or node group triggers a full reload at once. Age alone triggers one too (a safety net against
drift), but that one is built by a background thread and swapped in when ready, then
caught up like any other: no claim waits for it. A stale snapshot is never unsafe: every
claim re-checks its host under a row lock, and a conflict just refreshes and retries.
"""

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Count, Max
from django.utils import timezone

import placement as core
from capacity import loaders
from capacity.models import Allocation
from inventory.models import Hypervisor, NodeGroup

log = logging.getLogger(__name__)

FULL_RELOAD_SECONDS = 300
#: Host and group changes are looked for at most this often: a claim re-checks its host
#: under lock anyway, so a drained host missed for a second costs a retry, not a mistake.
VERSION_CHECK_SECONDS = 1.0
LOOKBACK_IDS = 50  # late commits are rare and short-lived
CLOCK_SKEW = timedelta(seconds=5)


@dataclass
class _Loaded:
    """One full load: an engine and what catching it up later needs."""

    version: tuple
    engine: core.PlacementEngine
    ids: dict[str, int]
    known: set[int]
    open: set[int]  # held open-ended: open claims, and claims still held after their end
    high_water: int
    synced_at: datetime
    loaded_at: float


class Snapshot:
    def __init__(self, options=None):
        self.options = options or placement_options()
        self.lock = threading.Lock()
        self.engine = None
        self._pending: _Loaded | None = None  # a background reload, ready to swap in
        self._reloading = None  # its thread while it runs
        self.background_reloads = 0
        # Claims written in transactions not yet committed: a decision in the transaction that
        # wrote them sees them (and must), but if it rolls back they never existed.
        self.tentative: set[int] = set()

    def reset(self):
        with self.lock:
            self.engine = None
            self._pending = None

    def expire(self):
        """Look for host changes on the next decision (after a change made in this process)."""
        self.version_checked = 0.0

    def current(self):
        """``(engine, ids)`` up to date with committed rows; callers must hold ``lock``."""
        now = timezone.now()
        pending, self._pending = self._pending, None
        if pending is not None and self.engine is not None and pending.loaded_at > self.loaded_at:
            self._install(pending)  # else a reload made meanwhile (hosts changed) is newer
        if self.engine is None or self._hosts_changed():
            self._install(self._load(now))
        else:
            if time.monotonic() - self.loaded_at > FULL_RELOAD_SECONDS:
                self._reload_in_background()
            self._catch_up(now)
        self._forget_rolled_back()
        return self.engine, self.ids

    def note_created(self, allocation_id):
        """An allocation was written in an open transaction: until it commits, the snapshot
        checks that it still exists (a rolled-back claim must not keep its room here)."""
        self.tentative.add(allocation_id)
        transaction.on_commit(lambda: self.tentative.discard(allocation_id))

    def _forget_rolled_back(self):
        if not self.tentative:
            return
        pending = set(self.tentative)
        gone = pending - set(Allocation.objects.filter(pk__in=pending).values_list("pk", flat=True))
        if gone:  # SQLite hands a rolled-back id out again (its sequence rolls back too): read from there
            self.high_water = min(self.high_water, min(gone) - 1)
        for alloc_id in gone:
            self.tentative.discard(alloc_id)
            if alloc_id in self.known:
                self.engine.remove_allocation(str(alloc_id))
                self.known.discard(alloc_id)
                self.open.discard(alloc_id)

    def wait_for_reload(self, timeout=None) -> bool:
        """Block until a running background reload has finished (tests, shutdown)."""
        thread = self._reloading
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _reload_in_background(self):
        if self._reloading is not None:
            return
        self._reloading = threading.Thread(target=self._background_load, name="vclmgr-snapshot", daemon=True)
        self._reloading.start()

    def _background_load(self):
        try:
            loaded = self._load(timezone.now())
        except Exception:  # the old snapshot stays in use; the next claim tries again
            log.exception("background snapshot reload failed")
            loaded = None
        finally:
            connection.close()  # this thread's own connection
        self._pending = loaded
        self.background_reloads += loaded is not None
        self._reloading = None

    def _version(self):
        hosts = Hypervisor.objects.aggregate(n=Max("updated"), c=Max("id"), k=Count("id"))
        groups = NodeGroup.objects.aggregate(n=Max("updated"), c=Max("id"), k=Count("id"))
        # Host tags bind claims (an image's required tags): a tag change alone, as an import
        # writes it (rows replaced, the host row untouched), must reload too.
        tags = loaders.host_tag_rows().aggregate(c=Max("id"), k=Count("id"))
        return tuple(hosts.values()) + tuple(groups.values()) + tuple(tags.values())

    def _hosts_changed(self):
        if time.monotonic() - self.version_checked < VERSION_CHECK_SECONDS:
            return False
        self.version_checked = time.monotonic()
        return self._version() != self.version

    def _load(self, now) -> _Loaded:
        started = time.monotonic()  # what the load reflects: a later one is newer
        version = self._version()
        cluster, ids = loaders.load_cluster(now)
        engine = core.PlacementEngine(cluster, self.options)
        # Build every host's timeline now: left lazy, the first claims after a load would
        # each pay for the thousands of hosts their window touches.
        engine.warm()
        known = {int(a.id) for h in cluster.hosts for a in h.allocations}
        high_water = max(known, default=Allocation.objects.aggregate(m=Max("id"))["m"] or 0)
        held_open = {int(a.id) for h in cluster.hosts for a in h.allocations if a.end is None}
        return _Loaded(version, engine, ids, known, held_open, high_water, now, started)

    def _install(self, loaded: _Loaded):
        self.version = loaded.version
        self.version_checked = time.monotonic()
        self.engine = loaded.engine
        self.ids = loaded.ids
        self.names = {pk: name for name, pk in loaded.ids.items()}
        self.known = loaded.known
        self.open = loaded.open
        self.high_water = loaded.high_water
        self.synced_at = loaded.synced_at
        self.loaded_at = loaded.loaded_at

    def _catch_up(self, now):
        changes = loaders.allocation_changes(self.high_water - LOOKBACK_IDS, self.synced_at - CLOCK_SKEW, now)
        for row in changes:
            alloc_id, host_id, end, released = row[0], row[1], row[7], row[-1]
            live = released is None  # over by now or not: held until released (its VM may still run)
            overdue = live and end is not None and end <= now
            stale = alloc_id not in self.known or (overdue and alloc_id not in self.open)
            self.high_water = max(self.high_water, alloc_id)
            if live and host_id in self.names and stale:
                if alloc_id in self.known:  # its end just passed: from now on it holds its room open-ended
                    self.engine.remove_allocation(str(alloc_id))
                self.engine.add_allocation(self.names[host_id], loaders.allocation_from_row(row[:-1], now))
                self.known.add(alloc_id)
                if overdue:
                    self.open.add(alloc_id)
            elif not live and alloc_id in self.known:
                self.engine.remove_allocation(str(alloc_id))
                self.known.discard(alloc_id)
                self.open.discard(alloc_id)
        self.synced_at = now


def placement_options(**overrides):
    """The core's options from the settings (the default IAllocator for the external policy)."""
    from django.conf import settings

    program = settings.IALLOCATORS.get(settings.DEFAULT_IALLOCATOR)
    return core.PlacementOptions(iallocator=program, **overrides)


snapshot = Snapshot()
