"""Operations on a host rather than a VM: ``node.evacuate`` (an evacuation plan, executed:
drain, then one ``vm.migrate`` per VM) and ``hypervisor.refresh`` (re-read its facts;
optionally follow reachability)."""

from django.conf import settings
from django.utils import timezone

from drivers import base
from drivers import registry as drivers
from inventory import services as inventory
from inventory.models import Hypervisor
from jobs import reasons
from jobs.registry import opcode
from provisioning import plans
from provisioning.models import VM
from provisioning.opcodes.common import S
from provisioning.opcodes.params import HostParams, RefreshParams, host_lock


@opcode("node.evacuate", params=HostParams, staff_only=True)
def node_evacuate(job):
    """Evacuate a host as a plan: drain it, re-place its future reservations, and migrate every
    VM off it where IAllocator node-evacuate puts them (one vm.migrate job per VM)."""
    host_id = job.params["hypervisor"]
    found = reasons.buckets(job.reason)
    plan = job.step("plan", evacuate_as_plan, host_id, found[0][1] if found else None, actor=job.actor)
    return {"hypervisor": host_id, **plan}


def evacuate_as_plan(host_id, rate_limit, *, actor):
    host = Hypervisor.objects.get(pk=host_id)
    plan = plans.compute("evacuate-node", actor=actor, target=host.name, rate_limit=rate_limit)
    plan = plans.execute(plan, actor=actor)
    return {"plan": plan.pk, "vms": [m["vm"] for m in plan.moves], "jobs": [m["job"] for m in plan.moves]}


@opcode("hypervisor.refresh", params=RefreshParams, locks=host_lock, staff_only=True)
def hypervisor_refresh(job):
    """Read a host's facts from its driver; an unreachable host is marked so in its facts.

    With ``drain_unreachable`` (the periodic refresh sets it) an unreachable online host is
    also drained, so placement stops choosing it, and put back online once it answers again —
    only if it was that refresh that drained it (``AUTO_DRAIN`` starts the state reason).
    """
    params = job.params
    drain_unreachable = params.get("drain_unreachable", False)
    return job.step("facts", refresh_facts, params["hypervisor"], drain_unreachable, actor=job.actor)


AUTO_DRAIN = "unreachable, drained by the facts refresh"
# A host silent for HOST_OFFLINE_AFTER_CHECKS refreshes in a row: offline, its VMs lost (the
# reservations app rebuilds them elsewhere when it sees this reason start a state change).
AUTO_OFFLINE = "unreachable, marked offline by the facts refresh"


def refresh_facts(host_id, drain_unreachable=False, *, actor):
    host = Hypervisor.objects.select_related("credential").get(pk=host_id)
    checked = timezone.now().isoformat()
    try:
        facts = {**drivers.driver_for(host).facts().as_dict(), "reachable": True, "checked": checked}
    except base.DriverError as exc:
        # failures in a row: the count restarts with every answer (a fresh facts dict has none)
        failures = 1 + (host.facts.get("failed_checks", 0) if host.facts.get("reachable") is False else 0)
        facts = {
            **host.facts,
            "reachable": False,
            "error": str(exc)[:1000],
            "checked": checked,
            "failed_checks": failures,
        }
    inventory.report_facts(host, facts, actor=actor)
    if drain_unreachable:
        _follow_reachability(host, facts, actor=actor)
    return {"reachable": facts["reachable"], "error": facts.get("error", ""), "state": host.state}


def _follow_reachability(host, facts, *, actor):
    """Silent once: drained (placement stops choosing it). Silent ``HOST_OFFLINE_AFTER_CHECKS``
    times in a row (from online, or drained by this refresh): offline, which has its
    reservations rebuilt elsewhere. Answering again undoes only what this refresh did: online,
    unless VMs lost with it may still be there (then drained until verify/repair cleans them)."""
    auto = host.state_reason.startswith((AUTO_DRAIN, AUTO_OFFLINE))
    limit = settings.HOST_OFFLINE_AFTER_CHECKS
    if not facts["reachable"]:
        failures = facts.get("failed_checks", 1)
        silent = f"{facts['error']} ({failures} failed check{'s' if failures != 1 else ''})"
        if (
            limit
            and failures >= limit
            and (host.state == Hypervisor.State.ONLINE or (host.state == Hypervisor.State.DRAINED and auto))
        ):
            inventory.set_state(host, Hypervisor.State.OFFLINE, f"{AUTO_OFFLINE}: {silent}"[:500], actor=actor)
        elif host.state == Hypervisor.State.ONLINE:
            inventory.set_state(host, Hypervisor.State.DRAINED, f"{AUTO_DRAIN}: {silent}"[:500], actor=actor)
        return
    if host.state == Hypervisor.State.ONLINE or not auto:
        return
    lost = VM.objects.filter(host=host, state=S.LOST).count()
    if lost:
        if host.state == Hypervisor.State.OFFLINE:
            inventory.set_state(
                host,
                Hypervisor.State.DRAINED,
                f"reachable again after being offline; {lost} lost "
                "VM(s) may still be on it: run verify, destroy them, then put it online",
                actor=actor,
            )
        return
    inventory.set_state(host, Hypervisor.State.ONLINE, "reachable again (facts refresh)", actor=actor)
