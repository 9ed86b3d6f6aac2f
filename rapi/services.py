"""The RAPI's writes: each builds on the apps' services and submits a job, whose id is the answer.

Ganeti answers every write with a job id, so even what vclmgr does at once (a host's state,
tags) runs as a job here (``opcodes``): the client waits for it the same way as for a create.
"""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from capacity import services as capacity
from core.errors import Conflict
from inventory import services as inventory
from inventory.models import Hypervisor, NodeGroup
from jobs import services as jobs
from provisioning import services as vms
from provisioning.models import VM
from rapi.models import ClusterTag

SOURCE = "gnt:rapi"


def _reason(reason, default):
    return [reason] if reason else [default]


def create_instance(*, actor, image, name, vcpus=None, memory_mib=None, disk_gib=None, pnode=None, reason=""):
    """Record the VM and submit its ``vm.create`` job; returns the job. With ``pnode`` the VM is
    claimed on that host first (``NoCapacity`` refuses), and built on that claim."""
    if VM.objects.exclude(state=VM.State.DESTROYED).filter(name=name).exists():
        raise Conflict(f"Instance '{name}' already exists")
    size = vms.size_for(image, vcpus, memory_mib, disk_gib)
    why = reason or f"created through the RAPI as {name}"
    with transaction.atomic():
        allocation = None
        if pnode is not None:
            demand = vms.demand_for(image, size, start=timezone.now(), end=None, purpose=f"instance {name}")
            try:
                allocation = capacity.claim_on_host(pnode, demand, actor=actor, owner=actor)
            except capacity.NoCapacity as exc:
                raise ValidationError({"pnode": [f"{pnode.name} cannot take it: {exc}"]}) from None
        _, job = vms.request_vm(
            actor=actor, owner=actor, image=image, name=name, allocation=allocation, reason=why, **size
        )
    return job


def submit(opcode, params, *, actor, reason):
    return jobs.submit(opcode, params, actor=actor, reason=reason, source=SOURCE)


def submit_vm(vm, action, *, actor, reason, **params):
    return vms.submit_action(vm, action, actor=actor, reason=reason or f"{action} {vm.key} through the RAPI", **params)


def reboot(vm, *, actor, reason, force=False):
    """Ganeti's reboot as vclmgr's two actions: a stop, then a start that waits for it. The
    start is the job answered (its end is the reboot's end; a failed stop fails it too)."""
    why = reason or f"reboot {vm.key} through the RAPI"
    with transaction.atomic():
        stop = submit_vm(vm, "stop", actor=actor, reason=why, force=force)
        return vms.submit_action(vm, "start", actor=actor, reason=why, depends=[stop])


def reinstall(vm, *, actor, reason, start=True):
    """Ganeti's reinstall: back to the clean snapshot taken before the first boot (what the image
    built), then started unless ``start`` is false. A VM without that snapshot cannot be."""
    if not vms.has_clean_snapshot(vm):
        raise Conflict(f"{vm.key} keeps no clean snapshot of its image (only images that revert or pool do)")
    why = reason or f"reinstall {vm.key} through the RAPI"
    with transaction.atomic():
        revert = submit_vm(vm, "revert", actor=actor, reason=why, name=vms.CLEAN_SNAPSHOT)
        if not start:
            return revert
        return vms.submit_action(vm, "start", actor=actor, reason=why, depends=[revert])


# --- what the RAPI's own opcodes do (run by a worker) ----------------------------------


def set_role(host, state, reason, *, actor):
    """Ganeti's node role as the host's state; returns the changed flags as Ganeti lists them."""
    before = host.state
    inventory.set_state(host, state, reason, actor=actor)
    flags = ("offline", "drained")
    changes = []
    for flag in flags:
        old, new = before == flag, state == flag
        if old != new:
            changes.append([flag, str(new)])
    return changes


def change_tags(kind, target, tags, *, add, actor, reason=""):
    """Add or remove tags on the cluster, a host or a VM."""
    if kind == "cluster":
        _cluster_tags(tags, add=add, actor=actor)
    elif kind == "node":
        current = set(target.tags.names())
        wanted = current | set(tags) if add else current - set(tags)
        inventory.update_hypervisor(target, actor=actor, tags=sorted(wanted), reason=reason or "RAPI tags")
    else:
        current = set(target.tags.names())
        wanted = current | set(tags) if add else current - set(tags)
        vms.set_tags(target, sorted(wanted), actor=actor, reason=reason or "RAPI tags")


@transaction.atomic
def _cluster_tags(tags, *, add, actor):
    from core import changelog

    if add:
        for name in tags:
            tag, made = ClusterTag.objects.get_or_create(name=name)
            if made:
                changelog.record(tag, "create", actor, {"name": [None, name]}, "RAPI cluster tag")
    else:
        for tag in ClusterTag.objects.filter(name__in=tags):
            changelog.record(tag, "delete", actor, {}, "RAPI cluster tag")
            tag.delete()


def modify_group(group_id, alloc_policy, *, actor, reason="RAPI group modify"):
    """A node group's allocation policy; the changes as Ganeti lists them (``[[param, value]]``)."""
    group = NodeGroup.objects.get(pk=group_id)
    changes = inventory.update_node_group(group, actor=actor, reason=reason, alloc_policy=alloc_policy)
    return [["alloc_policy", alloc_policy]] if changes else []


@transaction.atomic
def assign_nodes(group_id, host_ids, *, actor, reason="RAPI assign nodes"):
    """Put the hosts in the group (``None``: in none, Ganeti's implicit ``default``)."""
    group = NodeGroup.objects.get(pk=group_id) if group_id is not None else None
    for host in Hypervisor.objects.filter(pk__in=host_ids).order_by("pk"):
        inventory.update_hypervisor(host, actor=actor, reason=reason, group=group)
