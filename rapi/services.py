"""The RAPI's writes: each builds on the apps' services and submits a job, whose id is the answer.

Ganeti answers every write with a job id, so even what vclmgr does at once (a host's state,
tags) runs as a job here (``opcodes``): the client waits for it the same way as for a create.
Every job submitted here passes the job filter rules (``job_filters``) in the transaction
that submits it: one a rule rejects is canceled before any worker can claim it.
"""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from capacity import services as capacity
from core import changelog
from core.errors import Conflict
from inventory import services as inventory
from inventory.models import Hypervisor, NodeGroup
from jobs import services as jobs
from jobs.models import Job
from provisioning import resizing
from provisioning import services as vms
from provisioning.models import VM
from rapi import job_filters
from rapi.models import ClusterTag, FilterRule
from rapi.resources import op_id

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
        return screen(job, actor=actor)


def screen(job, *, actor):
    """Apply the job filter rules to a pending job (inside the transaction that submitted it, or
    that changed a rule holding it); returns it."""
    rules = list(FilterRule.objects.values("uuid", "priority", "watermark", "predicates", "action"))
    if not rules:
        return job
    ops = [{"OP_ID": op_id(job.opcode), **(job.params if isinstance(job.params, dict) else {})}]
    action, rule = job_filters.decide(rules, {"id": job.pk, "ops": ops, "reason": job.reason})
    name = action[0] if isinstance(action, list) else action
    if name == "REJECT":
        jobs.cancel(job, actor=actor, reason=f"rejected by job filter {rule['uuid']}")
        job.refresh_from_db()
    elif name in ("PAUSE", "RATE_LIMIT"):
        key, limit = job_filters.bucket(rule)
        jobs.hold(job, key, limit, actor=actor, reason=f"{name.lower()} by job filter {rule['uuid']}")
    return job


def _rescreen(rule_uuid, *, actor):
    """The jobs a rule held go back through the rules as they are now (none may hold them)."""
    for job in jobs.release(f"filter:{rule_uuid}", actor=actor, reason=f"job filter {rule_uuid} changed"):
        screen(job, actor=actor)


def multi_alloc(creations, *, actor, reason=""):
    """Ganeti's multi-allocation: each instance's create job, and one job answering which were
    submitted (``allocatable``) and which could not be placed on their ``pnode`` (``failed``)."""
    submitted, allocatable, failed = [], [], []
    with transaction.atomic():
        for creation in creations:
            try:
                with transaction.atomic():
                    submitted.append(create_instance(actor=actor, reason=reason, **creation).pk)
            except ValidationError as exc:
                if set(getattr(exc, "message_dict", {})) != {"pnode"}:
                    raise
                failed.append(creation["name"])
            else:
                allocatable.append(creation["name"])
        params = {"jobs": submitted, "allocatable": allocatable, "failed": failed}
        return submit("instance.multi_alloc", params, actor=actor, reason=reason or "multi-allocation through the RAPI")


@transaction.atomic
def submit(opcode, params, *, actor, reason):
    return screen(jobs.submit(opcode, params, actor=actor, reason=reason, source=SOURCE), actor=actor)


@transaction.atomic
def submit_vm(vm, action, *, actor, reason, depends=(), **params):
    why = reason or f"{action} {vm.key} through the RAPI"
    return screen(vms.submit_action(vm, action, actor=actor, reason=why, depends=depends, **params), actor=actor)


@transaction.atomic
def resize(vm, *, actor, reason, **size):
    """Ganeti's modify of an instance's backend parameters: vclmgr's resize (``vm.resize``)."""
    why = reason or f"modify {vm.key} through the RAPI"
    return screen(resizing.resize(vm, actor=actor, reason=why, **size), actor=actor)


def reboot(vm, *, actor, reason, force=False):
    """Ganeti's reboot as vclmgr's two actions: a stop, then a start that waits for it. The
    start is the job answered (its end is the reboot's end; a failed stop fails it too)."""
    why = reason or f"reboot {vm.key} through the RAPI"
    with transaction.atomic():
        stop = submit_vm(vm, "stop", actor=actor, reason=why, force=force)
        return submit_vm(vm, "start", actor=actor, reason=why, depends=[stop])


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
        return submit_vm(vm, "start", actor=actor, reason=why, depends=[revert])


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


# --- job filter rules (Ganeti stores them at once: no job) ------------------------------


def _check_rule(priority, predicates, action):
    try:
        job_filters.check_rule(priority, predicates, action)
    except job_filters.qfilter.FilterError as exc:
        raise ValidationError(str(exc)) from None


@transaction.atomic
def put_filter(rule_uuid, *, priority, predicates, action, reason_trail, actor):
    """Store a filter rule (a new one, or replace the one with ``rule_uuid``); returns it. Its
    watermark is the highest job id now, as Ganeti's."""
    _check_rule(priority, predicates, action)
    fields = {
        "priority": priority,
        "predicates": predicates,
        "action": action,
        "reason_trail": reason_trail,
        "watermark": Job.objects.order_by("-id").values_list("id", flat=True).first() or 0,
    }
    rule, made = FilterRule.objects.update_or_create(uuid=rule_uuid, defaults=fields)
    changelog.record(
        rule, "create" if made else "update", actor, {k: [None, v] for k, v in fields.items()}, "RAPI filter"
    )
    if not made:
        _rescreen(rule.uuid, actor=actor)
    return rule


@transaction.atomic
def delete_filter(rule, *, actor):
    changelog.record(rule, "delete", actor, {}, "RAPI filter")
    rule_uuid = rule.uuid
    rule.delete()
    _rescreen(rule_uuid, actor=actor)
