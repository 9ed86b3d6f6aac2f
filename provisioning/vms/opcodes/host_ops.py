"""Operations on a host rather than a VM: ``node.evacuate`` (drain, then one ``vm.migrate``
child per VM) and ``hypervisor.refresh`` (re-read its facts; optionally follow reachability)."""

from django.db import transaction
from django.utils import timezone

from inventory import services as inventory
from inventory.models import Hypervisor
from provisioning.drivers import base
from provisioning.drivers import registry as drivers
from provisioning.jobs.registry import opcode
from provisioning.vms.models import VM
from provisioning.vms.opcodes.common import S
from provisioning.vms.opcodes.params import HostParams, RefreshParams, host_lock


@opcode("node.evacuate", params=HostParams, staff_only=True)
def node_evacuate(job):
    """Drain a host and migrate every VM off it (one vm.migrate child job per VM)."""
    host_id = job.params["hypervisor"]
    job.step("drain", drain, host_id, actor=job.actor)
    vm_ids = job.step(
        "list",
        lambda: list(
            VM.objects.filter(host_id=host_id, state__in=(S.RUNNING, S.STOPPED, S.SUSPENDED))
            .order_by("pk")
            .values_list("pk", flat=True)
        ),
    )
    children = [job.submit_child("vm.migrate", {"vm": vm_id}, key=f"vm-{vm_id}") for vm_id in vm_ids]
    return {"hypervisor": host_id, "vms": vm_ids, "jobs": children}


def drain(host_id, *, actor):
    host = Hypervisor.objects.get(pk=host_id)
    if host.state == Hypervisor.State.ONLINE:
        with transaction.atomic():
            inventory.set_state(host, Hypervisor.State.DRAINED, "evacuating", actor=actor)
    return host.state


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


def refresh_facts(host_id, drain_unreachable=False, *, actor):
    host = Hypervisor.objects.select_related("credential").get(pk=host_id)
    checked = timezone.now().isoformat()
    try:
        facts = {**drivers.driver_for(host).facts().as_dict(), "reachable": True, "checked": checked}
    except base.DriverError as exc:
        facts = {**host.facts, "reachable": False, "error": str(exc)[:1000], "checked": checked}
    inventory.report_facts(host, facts, actor=actor)
    if drain_unreachable:
        _follow_reachability(host, facts, actor=actor)
    return {"reachable": facts["reachable"], "error": facts.get("error", ""), "state": host.state}


def _follow_reachability(host, facts, *, actor):
    if not facts["reachable"] and host.state == Hypervisor.State.ONLINE:
        inventory.set_state(host, Hypervisor.State.DRAINED, f"{AUTO_DRAIN}: {facts['error']}"[:500], actor=actor)
    elif facts["reachable"] and host.state == Hypervisor.State.DRAINED and host.state_reason.startswith(AUTO_DRAIN):
        inventory.set_state(host, Hypervisor.State.ONLINE, "reachable again (facts refresh)", actor=actor)
