"""A per-process placement engine kept close to the database, cheaply.

Loading every host and allocation costs about a second at 10,000 hosts, far too slow per
claim. Each process keeps one engine and brings it up to date before each decision:
new allocations (by id, re-reading a window below the high-water mark for late commits)
and released ones (by release time) are applied incrementally; a change to any host or
node group, or age, triggers a full reload. A stale snapshot is never unsafe: every
claim re-checks its host under a row lock, and a conflict just refreshes and retries.
"""

import threading
import time
from datetime import timedelta

from django.db.models import Count, Max
from django.utils import timezone

from inventory.models import Hypervisor, NodeGroup
from provisioning import placement as core
from provisioning.capacity import loaders
from provisioning.capacity.models import Allocation

FULL_RELOAD_SECONDS = 300
#: Host and group changes are looked for at most this often: a claim re-checks its host
#: under lock anyway, so a drained host missed for a second costs a retry, not a mistake.
VERSION_CHECK_SECONDS = 1.0
LOOKBACK_IDS = 50  # late commits are rare and short-lived
CLOCK_SKEW = timedelta(seconds=5)


class Snapshot:
    def __init__(self, options=None):
        self.options = options or core.PlacementOptions()
        self.lock = threading.Lock()
        self.engine = None

    def reset(self):
        with self.lock:
            self.engine = None

    def expire(self):
        """Look for host changes on the next decision (after a change made in this process)."""
        self.version_checked = 0.0

    def current(self):
        """``(engine, ids)`` up to date with committed rows; callers must hold ``lock``."""
        now = timezone.now()
        if self.engine is None or time.monotonic() - self.loaded_at > FULL_RELOAD_SECONDS or self._hosts_changed():
            self._load(now)
        else:
            self._catch_up(now)
        return self.engine, self.ids

    def _version(self):
        hosts = Hypervisor.objects.aggregate(n=Max("updated"), c=Max("id"), k=Count("id"))
        groups = NodeGroup.objects.aggregate(n=Max("updated"), c=Max("id"), k=Count("id"))
        return tuple(hosts.values()) + tuple(groups.values())

    def _hosts_changed(self):
        if time.monotonic() - self.version_checked < VERSION_CHECK_SECONDS:
            return False
        self.version_checked = time.monotonic()
        return self._version() != self.version

    def _load(self, now):
        self.version = self._version()
        self.version_checked = time.monotonic()
        cluster, self.ids = loaders.load_cluster(now)
        self.engine = core.PlacementEngine(cluster, self.options)
        # Build every host's timeline now: left lazy, the first claims after a load would
        # each pay for the thousands of hosts their window touches.
        self.engine.warm()
        self.names = {pk: name for name, pk in self.ids.items()}
        self.known = {int(a.id) for h in cluster.hosts for a in h.allocations}
        self.high_water = max(self.known, default=Allocation.objects.aggregate(m=Max("id"))["m"] or 0)
        self.synced_at = now
        self.loaded_at = time.monotonic()

    def _catch_up(self, now):
        changes = loaders.allocation_changes(self.high_water - LOOKBACK_IDS, self.synced_at - CLOCK_SKEW)
        for row in changes:
            alloc_id, host_id, end, released = row[0], row[1], row[7], row[-1]
            live = released is None and (end is None or end > now)
            self.high_water = max(self.high_water, alloc_id)
            if live and alloc_id not in self.known and host_id in self.names:
                self.engine.add_allocation(self.names[host_id], loaders.allocation_from_row(row[:-1]))
                self.known.add(alloc_id)
            elif not live and alloc_id in self.known:
                self.engine.remove_allocation(str(alloc_id))
                self.known.discard(alloc_id)
        self.synced_at = now


snapshot = Snapshot()
