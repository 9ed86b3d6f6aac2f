"""A built VM's vCPUs and memory changed (Ganeti's ``gnt-instance modify -B``, OpenStack's resize).

``resize`` checks the request and submits ``vm.resize`` (``opcodes/resize.py``), an operators'
opcode: an owner asks an operator, as for a migration. The job changes the claim first, on the
VM's own host for the rest of its window (``capacity.resize``: one transaction, a growth
re-checked under the host's lock, a refusal explained by placement), then the VM's persistent
definition through its driver. A running VM gets the new size at its next boot, unless its
driver applied it at once (its answer, ``applies``: ``now`` or ``next boot``). A driver that
fails puts the claim back as it was (``undo``) and the job fails with its reason.

A running or suspended VM may only grow: its guest keeps what it booted with until it stops, so
a smaller claim would count less than it uses. Its disk keeps its size (a disk only grows, and
its file system with it: not something every driver and guest can do unattended).
"""

import logging
from collections.abc import Callable
from datetime import UTC

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from accounts import access
from capacity import services as capacity
from core.changelog import Actor
from core.errors import Conflict
from core.hooks import Hook
from drivers import registry as drivers
from inventory.models import Hypervisor
from jobs import services as jobs
from placement import refusals
from provisioning import services
from provisioning.models import VM

logger = logging.getLogger(__name__)

FIELDS = ("vcpus", "memory_mib")
LIMITS = {"vcpus": 1, "memory_mib": 16}  # as a driver's spec (``base.VMSpec.validate``)
BUILT = (VM.State.RUNNING, VM.State.STOPPED, VM.State.SUSPENDED)

# What else holds a VM's size (a reservation, above this layer) registers ``(vm, size, *, actor)``;
# called in the transaction that records the VM's new size.
ON_RESIZED: Hook[Callable[..., None]] = Hook("provisioning.resizing.ON_RESIZED")


def resize(vm, *, actor, vcpus=None, memory_mib=None, reason=""):
    """Submit the ``vm.resize`` job that gives ``vm`` these vCPUs and memory (None: as it has);
    returns the job. ``ValidationError`` for a size the VM's image does not allow, ``Conflict``
    for a VM that cannot be resized now (not built, no live claim of its own, a shrink while it
    runs), ``PermissionDenied`` for a user who may not operate the cluster (an owner too)."""
    actor = Actor.of(actor)
    if actor.user is not None and not access.can(actor.user, "operate"):
        raise PermissionDenied("only operators resize VMs: ask one (a VM's owner may not change its size)")
    size = wanted(vm, vcpus=vcpus, memory_mib=memory_mib)
    refusal = refusal_for(vm, size)
    if refusal:
        raise Conflict(refusal)
    return jobs.submit(
        "vm.resize",
        {"vm": vm.pk, **size},
        actor=actor,
        submitter=actor.user,
        reason=reason or f"resize {vm.key} to {size['vcpus']} vCPUs, {size['memory_mib']} MiB",
    )


def wanted(vm, *, vcpus=None, memory_mib=None):
    """The size asked for, completed from the VM's; ``ValidationError`` per field."""
    if vcpus is None and memory_mib is None:
        raise ValidationError({"vcpus": ["give vcpus, memory_mib or both"]})
    size = {
        "vcpus": vm.vcpus if vcpus is None else vcpus,
        "memory_mib": vm.memory_mib if memory_mib is None else memory_mib,
    }
    image = vm.image
    errors = {}
    for name, low in (("vcpus", image.min_vcpus), ("memory_mib", image.min_memory_mib)):
        value = size[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < LIMITS[name]:
            errors[name] = [f"a whole number of at least {LIMITS[name]}"]
        elif value < (low or 0):
            errors[name] = [f"{image.name} needs at least {low}"]
    if errors:
        raise ValidationError(errors)
    return size


def refusal_for(vm, size):
    """Why ``vm`` cannot take ``size`` now, or None (asked at submission and again by the job)."""
    if vm.state not in BUILT:
        return f"cannot resize {vm}: it is {vm.state} (only a built VM: running, stopped or suspended)"
    held = vm.allocation
    if held is None or held.released is not None:
        return f"{vm} holds no claim on a host any more: it cannot be resized"
    for check, what in (
        (services.is_parked_claim, "parked for its next user"),
        (services.is_kept_claim, "kept stopped for inspection"),
        (services.is_suspended_claim, "suspended to make room for work of a higher class"),
    ):
        if check(held):
            return f"{vm} is {what} (only its disk is claimed): it cannot be resized"
    shrinks = [name for name in FIELDS if size[name] < getattr(vm, name)]
    if shrinks and vm.state != VM.State.STOPPED:
        return (
            f"{vm} is {vm.state}: its guest keeps the {' and '.join(shrinks)} it booted with until it stops, "
            "so it may only grow now; stop it to make it smaller"
        )
    return None


# --- the job's steps (``opcodes/resize.py``) ------------------------------------------------


def claim(vm_id, size, *, actor):
    """Resize the VM's claim (``capacity.resize``) and point the VM at the new one, in one
    transaction; returns the old and new sizes and claims. ``NoCapacity`` changes nothing."""
    with transaction.atomic():
        vm = VM.objects.select_related("allocation", "image", "host").get(pk=vm_id)
        wanted(vm, **size)  # again, as for a job submitted by name (the jobs API) rather than through ``resize``
        refusal = refusal_for(vm, size)  # again: the VM may have changed since it was asked
        if refusal:
            raise Conflict(refusal)
        old = {name: getattr(vm, name) for name in FIELDS}
        held = vm.allocation
        if size == old:
            return {"old": old, "new": size, "from": held.pk, "to": held.pk}
        why = f"{vm.key} resized to {size['vcpus']} vCPUs, {size['memory_mib']} MiB"
        try:
            fresh = capacity.resize(held, actor=actor, reason=why, **size)
        except capacity.NoCapacity as exc:
            raise Conflict(no_room(vm, size, exc.result)) from None
        services.set_state(vm_id, vm.state, f"claim resized on {vm.host}", allocation=fresh, actor=actor)
    return {"old": old, "new": size, "from": held.pk, "to": fresh.pk}


def no_room(vm, size, result):
    """A refused growth in the words of placement's one-host check (what the host would lack)."""
    why = ", ".join(refusals.phrase(code) for code, n in result.reasons.items() if n) or result.note or "no room"
    end = vm.allocation.end
    until = f"until {end.astimezone(UTC):%Y-%m-%d %H:%M} UTC" if end else "from now on"
    return (
        f"{vm.host} has no room for {vm.key} at {size['vcpus']} vCPUs and {size['memory_mib']} MiB {until} "
        f"(its claim's window): {why}"
    )


def record(vm_id, size, applies, *, actor):
    """The VM's new size, after its driver took it; each snapshot it keeps is marked with the
    size it was taken at (a revert to it goes back to that definition: ``lifecycle.revert``
    gives it this size again)."""
    with transaction.atomic():
        vm = VM.objects.get(pk=vm_id)
        old = [vm.vcpus, vm.memory_mib]
        snapshots = [{"size": old, **snap} for snap in vm.snapshots or []]
        note = f"resized to {size['vcpus']} vCPUs, {size['memory_mib']} MiB ({applies})"
        services.set_state(vm_id, vm.state, note, snapshots=snapshots, actor=actor, **size)
        for hook in ON_RESIZED:
            hook(vm, size, actor=actor)


def undo(vm_id, claimed, reason, *, actor, reported=None):
    """The driver did not take the new size: the claim goes back to the size the VM has (a
    fact, written unchecked by ``capacity.resize``), in one transaction. ``reported``: the size
    the driver says the VM has now (``reported_size``; None: not known); a field it reports
    larger than the old size is kept (a change the driver made after all, its wait timed out)."""
    if claimed is None or claimed["from"] == claimed["to"]:
        return
    back_to = {name: max(claimed["old"][name], (reported or {}).get(name) or 0) for name in FIELDS}
    with transaction.atomic():
        # Whatever live claim the VM holds now, not only the one ``claim`` wrote: an extension of
        # its reservation (``reservations.ending.extend``, which takes no VM lock) may have moved
        # it to a fresh row meanwhile, copying the new size. Serialising extensions against this
        # job instead would make a user's extension wait on (or fail for) a driver's call; read
        # under the host's lock, the one every claim change takes, the VM's claim cannot move
        # between this read and ``capacity.resize`` (which would refuse a released one anyway).
        vm = VM.objects.select_related("allocation").get(pk=vm_id)
        held = vm.allocation
        if held is None or held.released is not None:
            return  # it ended meanwhile: nothing left to put back
        Hypervisor.objects.select_for_update().get(pk=held.host_id)
        vm = VM.objects.select_related("allocation").get(pk=vm_id)
        held = vm.allocation
        if held is None or held.released is not None or held.host_id != vm.host_id:
            return  # it ended or was repaired meanwhile: nothing of this job's to put back
        if all(getattr(held, name) == back_to[name] for name in FIELDS):
            return
        why = f"{vm.key}: resize failed: {reason}"
        back = capacity.resize(held, actor=actor, reason=why, check=False, **back_to)
        services.set_state(vm_id, vm.state, "resize undone", allocation=back, actor=actor)
        # What holds the VM's size (its reservation) says the size the claim counts again.
        for hook in ON_RESIZED:
            hook(vm, back_to, actor=actor)


def reported_size(vm_id):
    """The vCPUs and memory the VM's driver reports for it now (its ``list_vms``), None where it
    does not say or cannot be asked (a failed resize is undone as if nothing changed)."""
    vm = VM.objects.select_related("host").get(pk=vm_id)
    try:
        found = next((info for info in drivers.driver_for(vm.host).list_vms() if info.key == vm.key), None)
    except Exception:
        logger.warning("cannot read %s's size from its host after a failed resize", vm.key, exc_info=True)
        return None
    if found is None:
        return None
    return {name: getattr(found, name) or None for name in FIELDS}
