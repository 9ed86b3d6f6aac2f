"""Helpers for the plan tests: an unbalanced sim cluster, and what to measure of a plan's run."""

from datetime import timedelta

from django.utils import timezone

from capacity import services as capacity
from capacity.models import Allocation
from capacity.snapshot import snapshot
from jobs.models import Job
from provisioning import plans, services
from provisioning.models import VM, Plan
from tests.jobs.helpers import wait_until


def build_cluster(make_host, image, owner, sync_jobs, full=3, empty=3, vms=12, group=None, prefix="h", **size):
    """``full`` hosts holding ``vms`` VMs between them, then ``empty`` hosts added: unbalanced."""
    size = {"cpus": 16, "memory_mib": 32768, "disk_gib": 500, **size}
    hosts = [make_host(f"{prefix}{i:02d}", group=group, **size) for i in range(full)]
    snapshot.expire()
    made = [services.request_vm(actor=owner, owner=owner, image=image, memory_mib=2048)[0] for _ in range(vms)]
    sync_jobs.drain()
    assert set(VM.objects.filter(pk__in=[v.pk for v in made]).values_list("state", flat=True)) == {"running"}
    hosts += [make_host(f"{prefix}{i:02d}", group=group, **size) for i in range(full, full + empty)]
    snapshot.expire()
    return hosts, made


def future_claim(host, hours=2, memory_mib=24576):
    """An accepted future reservation's claim on ``host`` (most of its memory, later)."""
    start = timezone.now() + timedelta(hours=hours)
    demand = capacity.Demand(2, memory_mib, 10, start, start + timedelta(hours=1), purpose="reservation (future)")
    return capacity.claim_on_host(host, demand, actor="test")


def overcommits(host):
    """Moments at which the host's claims (as they existed over time) exceed its memory: each
    row counts from its creation until its release, over its own window."""
    rows = list(Allocation.objects.filter(host=host))
    limit = host.memory_mib * host.memory_ratio - host.reserved_memory_mib
    found = []
    for moment in sorted({r.created for r in rows} | {r.released for r in rows if r.released}):
        alive = [r for r in rows if r.created <= moment and (r.released is None or r.released > moment)]
        edges = sorted({r.start for r in alive} | {r.end for r in alive if r.end})
        for t in edges:
            used = sum(r.memory_mib for r in alive if r.start <= t and (r.end is None or t < r.end))
            if used > limit:
                found.append((moment, t, used))
    return found


def max_running_at_once(job_rows):
    edges = []
    for job in job_rows:
        assert job.started and job.ended, (job.pk, job.status, job.error_message)
        edges += [(job.started, 1), (job.ended, -1)]
    running = peak = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        running += step
        peak = max(peak, running)
    return peak


def wait_plan(plan, child, timeout=120):
    def ended():
        # The plan is done once its last move switched; that move's job ends a moment later.
        ids = [m["job"] for m in Plan.objects.get(pk=plan.pk).moves]
        settled = not Job.objects.filter(pk__in=ids).exclude(status__in=Job.FINAL).exists()
        return settled and plans.refresh(Plan.objects.get(pk=plan.pk)).state in Plan.FINAL

    wait_until(ended, timeout, f"plan {plan.pk} to end", child)
    return Plan.objects.get(pk=plan.pk)
