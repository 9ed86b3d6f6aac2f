"""The admin dashboard's numbers: one read-only function per panel, plain dicts out (JSON-ready).

Contract: nothing here writes (``queue_state`` may create the queue's settings row once) and the
number of queries does not grow with the inventory: ``gather`` stays within ``QUERY_BUDGET``
for 10 hosts or 10,000. "Allocated now" counts allocations not released with
``start <= now < end`` (open-ended: no end); usable capacity is the placement core's
``(total − reserved) × overcommit``, computed by the same loader placement uses. Offline hosts
count nothing (as in placement): they appear in the heat map, not in the utilisation sums.
Warm pools are counted by ``provisioning.warm.counts``, the function /metrics reads them with.
"""

from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, Sum
from django.utils import timezone

from capacity import loaders
from inventory.models import BladeCenter, Hypervisor
from jobs.models import Job
from jobs.services import queue_state
from provisioning import warm
from reservations.models import Reservation

RESOURCES = ("vcpus", "memory_mib", "disk_gib")
QUERY_BUDGET = 13  # (the warm pools: their VMs, the pooled images, their usage history)
TIMELINE_HOURS = 72
LATEST_JOBS = 10
FAILED_WINDOW = timedelta(hours=24)
# Timeline series: a reservation's current status decides its colour for its whole window.
SERIES = {
    "running": ("ready", "ending"),
    "starting": ("placing", "provisioning"),
    "booked": ("requested", "pending"),
}


@dataclass(frozen=True, slots=True)
class HostUse:
    id: int
    name: str
    state: str
    group: str
    chassis_id: int | None
    slot: int | None
    usable: dict
    used: dict
    allocations: int

    @property
    def ratios(self):
        return {r: _ratio(self.used[r], self.usable[r]) for r in RESOURCES}

    @property
    def utilisation(self):
        """The tightest resource: what limits the next VM on this host."""
        return max(self.ratios.values())


def _ratio(used, usable):
    if usable <= 0:
        return 1.0 if used > 0 else 0.0
    return used / usable


def hosts(now):
    """Every host with its usable capacity and what is allocated on it at ``now`` (2 queries)."""
    # Placement's own idea of a live allocation, summed per host by the database.
    live = loaders.live_allocations(now).filter(start__lte=now).order_by().values("host_id")
    sums = {f"total_{r}": Sum(r) for r in RESOURCES}
    used, count = {}, {}
    for host_id, allocations, *totals in live.annotate(n=Count("id"), **sums).values_list("host_id", "n", *sums):
        used[host_id], count[host_id] = dict(zip(RESOURCES, totals, strict=True)), allocations
    found = []
    n = len(loaders.HOST_COLUMNS)
    for row in Hypervisor.objects.values_list(*loaders.HOST_COLUMNS, "blade_center_id", "slot").order_by("name"):
        core_host = loaders.host_from_row(row[:n], (), ())
        usable = core_host.usable()
        found.append(
            HostUse(
                id=row[0],
                name=core_host.name,
                state=str(core_host.state),
                group=core_host.group,
                chassis_id=row[n],
                slot=row[n + 1],
                usable={r: usable.get(r) for r in RESOURCES},
                used=dict(used.get(row[0]) or dict.fromkeys(RESOURCES, 0.0)),
                allocations=count.get(row[0], 0),
            )
        )
    return found


def _sums(members):
    counted = [h for h in members if h.state != "offline"]
    out = {"hosts": len(members), "states": _states(members), "vms": sum(h.allocations for h in counted)}
    for r in RESOURCES:
        used = sum(h.used[r] for h in counted)
        usable = sum(h.usable[r] for h in counted)
        out[r] = {"used": round(used, 2), "usable": round(usable, 2), "ratio": round(_ratio(used, usable), 4)}
    return out


def _states(members):
    states = dict.fromkeys(Hypervisor.State.values, 0)
    for h in members:
        states[h.state] = states.get(h.state, 0) + 1
    return states


def utilisation(host_uses):
    """Allocated now vs usable capacity per resource, overall and per node group (no queries)."""
    groups = defaultdict(list)
    for h in host_uses:
        groups[h.group].append(h)
    return {
        "overall": _sums(host_uses),
        "groups": [{"name": name, **_sums(members)} for name, members in sorted(groups.items())],
    }


def _cell(h):
    return {
        "id": h.id,
        "name": h.name,
        "state": h.state,
        "group": h.group,
        "slot": h.slot,
        "vms": h.allocations,
        "utilisation": round(h.utilisation, 4),
        "ratios": {r: round(v, 4) for r, v in h.ratios.items()},
    }


def heatmap(host_uses):
    """Rows of chassis slots (empty slots as None), then the hosts without a chassis (1 query)."""
    by_chassis = defaultdict(dict)
    loose = []
    for h in host_uses:
        if h.chassis_id is None:
            loose.append(_cell(h))
        else:
            by_chassis[h.chassis_id][h.slot] = _cell(h)
    rows = []
    for pk, name, site, slot_count in BladeCenter.objects.values_list("id", "name", "site", "slot_count"):
        slots = by_chassis.get(pk, {})
        rows.append({"id": pk, "name": name, "site": site, "slots": [slots.get(n) for n in range(1, slot_count + 1)]})
    if loose:
        rows.append({"id": None, "name": "no chassis", "site": "", "slots": loose})
    return {"rows": rows}


def timeline(now, hours=TIMELINE_HOURS):
    """Reservations holding capacity per hour from the current hour on, stacked by status (1 query).

    A reservation counts in every hour its window touches; ``now`` is the current hour's total.
    """
    t0 = now.replace(minute=0, second=0, microsecond=0)
    t1 = t0 + timedelta(hours=hours)
    statuses = [s for group in SERIES.values() for s in group]
    series_of = {s: name for name, group in SERIES.items() for s in group}
    delta = {name: [0] * (hours + 1) for name in SERIES}
    rows = Reservation.objects.filter(status__in=statuses, start__lt=t1, end__gt=t0)
    for start, end, status in rows.values_list("start", "end", "status"):
        first = max(0, int((start - t0).total_seconds() // 3600))
        last = min(hours, -int(-(end - t0).total_seconds() // 3600))  # ceil: the hour the end falls in
        delta[series_of[status]][first] += 1
        delta[series_of[status]][last] -= 1
    counts = {}
    for name, steps in delta.items():
        running, out = 0, []
        for step in steps[:hours]:
            running += step
            out.append(running)
        counts[name] = out
    return {
        "start": t0.isoformat(),
        "hours": [(t0 + timedelta(hours=i)).isoformat() for i in range(hours)],
        "series": counts,
        "now": sum(counts[name][0] for name in counts),
    }


def job_queue(now, latest=LATEST_JOBS):
    """Running, queued, waiting and recently failed jobs, and the latest jobs (about 6 queries)."""
    state = queue_state()
    failed = Job.objects.filter(status=Job.Status.ERROR, ended__gte=now - FAILED_WINDOW).count()
    rows = Job.objects.order_by("-id").values(
        "id", "opcode", "status", "submitter__username", "received", "ended", "error_message"
    )[:latest]
    jobs = [
        {
            "id": j["id"],
            "opcode": j["opcode"],
            "status": j["status"],
            "submitter": j["submitter__username"] or "",
            "received": j["received"].isoformat(),
            "ended": j["ended"].isoformat() if j["ended"] else None,
            "error": j["error_message"][:200],
        }
        for j in rows
    ]
    return {
        "running": state["running"],
        "queued": state["queued"],
        "waiting": state["waiting"],
        "limit": state["limit"],
        "failed_24h": failed,
        "latest": jobs,
    }


def warm_pools():
    """Each pooled image's pool (and any image whose VMs were pooled once): its sizes and the
    numbers /metrics shows, by image name (2 queries)."""
    return [{"image": name, **row} for name, row in sorted(warm.counts().items())]


def gather(now=None):
    """Every panel at ``now``, within ``QUERY_BUDGET`` queries."""
    now = now or timezone.now()
    host_uses = hosts(now)
    return {
        "generated": now.isoformat(),
        "utilisation": utilisation(host_uses),
        "heatmap": heatmap(host_uses),
        "timeline": timeline(now),
        "jobs": job_queue(now),
        "warm_pools": warm_pools(),
    }
