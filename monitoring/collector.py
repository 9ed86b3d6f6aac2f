"""Gauges of state read from the database at scrape time (the same from any process).

Capacity is the dashboard's (``monitoring.dashboard``): usable = (total − reserved) × overcommit
as placement computes it, allocated = live claims now; offline hosts count in neither.
Warm pools per image from their VMs (``provisioning.warm.counts``). A handful of grouped queries
whatever the size of the inventory.
"""

from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from inventory.models import Hypervisor
from jobs.models import Job
from monitoring import dashboard
from notifications.models import Notification, WebhookDelivery
from provisioning import warm
from provisioning.models import VM
from reservations.models import Reservation

PENDING_STATES = ("queued", "sending", "retry", "failed")


class StateCollector:
    def collect(self):
        yield from self._capacity()
        yield _counted("vclmgr_hosts", "Hypervisors by state.", "state", Hypervisor, "state", Hypervisor.State.values)
        yield _counted(
            "vclmgr_reservations", "Reservations by status.", "status", Reservation, "status", Reservation.Status.values
        )
        yield _counted("vclmgr_vms", "VMs by state.", "state", VM, "state", VM.State.values)
        queue = GaugeMetricFamily("vclmgr_jobs", "Unfinished jobs by status and opcode.", labels=["status", "opcode"])
        rows = (
            Job.objects.exclude(status__in=Job.FINAL).order_by().values_list("status", "opcode").annotate(n=Count("id"))
        )
        seen = {status: 0 for status in ("queued", "waiting", "running")}
        for status, opcode, n in rows:
            queue.add_metric([status, opcode], n)
            seen[status] = seen.get(status, 0) + n
        yield queue
        depth = GaugeMetricFamily("vclmgr_job_queue_depth", "Unfinished jobs by status.", labels=["status"])
        for status, n in seen.items():
            depth.add_metric([status], n)
        yield depth
        outbox = GaugeMetricFamily(
            "vclmgr_deliveries", "Mails and webhook deliveries not sent (yet).", labels=["channel", "state"]
        )
        for channel, model in (("mail", Notification), ("webhook", WebhookDelivery)):
            counts = dict(
                model.objects.filter(state__in=PENDING_STATES).order_by().values_list("state").annotate(n=Count("id"))
            )
            for state in PENDING_STATES:
                outbox.add_metric([channel, state], counts.get(state, 0))
        yield outbox
        yield from self._warm_pools()

    def _warm_pools(self):
        """Per pooled image: the pool's target for the coming hour (from its usage history), warm
        VMs (ready, being built; those made ahead of a class session's seats), VMs taken warm
        still in use, and the reservations that found one (hits) or were built cold (misses),
        counted from the VMs."""
        pools = warm.counts()
        wanted = GaugeMetricFamily(
            "vclmgr_warm_wanted", "Warm VMs a pool wants for the coming hour, by image.", labels=["image"]
        )
        ahead = GaugeMetricFamily(
            "vclmgr_warm_ahead", "Warm VMs made ahead of a class session's seats, by image.", labels=["image"]
        )
        ready = GaugeMetricFamily("vclmgr_warm_vms", "Warm VMs by image and state.", labels=["image", "state"])
        in_use = GaugeMetricFamily("vclmgr_warm_in_use", "VMs taken warm, still in use, by image.", labels=["image"])
        hits = CounterMetricFamily("vclmgr_warm_hits", "Reservations that took a warm VM, by image.", labels=["image"])
        misses = CounterMetricFamily(
            "vclmgr_warm_misses", "Reservations of a pooled image built cold, by image.", labels=["image"]
        )
        for image, row in sorted(pools.items()):
            wanted.add_metric([image], row["wanted"])
            ahead.add_metric([image], row["ahead"])
            ready.add_metric([image, "ready"], row["ready"])
            ready.add_metric([image, "building"], row["building"])
            in_use.add_metric([image], row["in_use"])
            hits.add_metric([image], row["hits"])
            misses.add_metric([image], row["misses"])
        yield from (wanted, ready, ahead, in_use, hits, misses)

    def _capacity(self):
        usage = dashboard.utilisation(dashboard.hosts(timezone.now()))
        usable = GaugeMetricFamily(
            "vclmgr_capacity_usable", "Usable capacity of hosts in service.", labels=["group", "resource"]
        )
        allocated = GaugeMetricFamily(
            "vclmgr_capacity_allocated", "Capacity claimed now.", labels=["group", "resource"]
        )
        for group in usage["groups"]:
            for resource in dashboard.RESOURCES:
                usable.add_metric([group["name"], resource], group[resource]["usable"])
                allocated.add_metric([group["name"], resource], group[resource]["used"])
        yield usable
        yield allocated


def _counted(name, doc, label, model, field, values):
    family = GaugeMetricFamily(name, doc, labels=[label])
    counts = dict(model.objects.order_by().values_list(field).annotate(n=Count("id")))
    for value in dict.fromkeys([*values, *counts]):
        family.add_metric([value], counts.get(value, 0))
    return family
