"""The repairs the verify report offers, each confirmed by an admin and run as a job
(``repair.*`` opcodes in ``opcodes/repair.py``, staff only). Each checks the hypervisor again
now rather than trusting the report, calls the driver with no transaction open, and is
idempotent: a repair done already answers with a note and changes nothing.

- ``adopt``: an unknown VM on a host becomes a vclmgr VM (its size read from the driver, its
  hypervisor name kept in ``VM.host_key``) with an open-ended claim on that host, refused when
  the host lacks room (or takes no new VMs).
- ``destroy``: an unknown VM is destroyed through the driver; one whose name is not vclmgr's is
  refused unless forced. A ``lost`` VM (its host died; ``reservations`` rebuilt it elsewhere)
  found on its returned host is destroyed this way, and its row becomes ``destroyed``.
- ``drift``: the database takes the hypervisor's state.
- ``absent``: a VM the host does not run is marked gone: its claims released, and the holders
  registered in ``ON_GONE`` told (reservations ends its reservation with the reason).
"""

from collections.abc import Callable

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from capacity import services as capacity
from core import changelog
from core.errors import Conflict
from core.hooks import Hook
from drivers import base
from drivers import registry as drivers
from inventory.models import Hypervisor
from jobs import services as jobs
from placement import refusals
from provisioning import services
from provisioning.models import VM, Image
from provisioning.verify import CHECKED, OUR_KEY

ACTIONS = ("adopt", "destroy", "drift", "absent")
ADOPTED_IMAGE = "adopted"
# ``(vm, reason, *, actor)``: a VM was found gone from its host (reservations ends its reservation).
ON_GONE: Hook[Callable[..., None]] = Hook("provisioning.repair.ON_GONE")
_STATE = {base.VMState.RUNNING: VM.State.RUNNING, base.VMState.SUSPENDED: VM.State.SUSPENDED}


def submit(action, fields, *, actor, source):
    """Submit the job of one repair from a page or API request (names resolved to ids here,
    so the job's parameters stay stable); ``ValidationError`` naming the field when wrong."""
    if action not in ACTIONS:
        raise ValidationError({"action": [f"unknown repair {str(action)[:30]!r} (use {', '.join(ACTIONS)})"]})
    params = {}
    if action in ("adopt", "destroy"):
        host = Hypervisor.objects.filter(name__iexact=str(fields.get("host", ""))).first()
        if host is None:
            raise ValidationError({"host": ["no such hypervisor"]})
        params = {"hypervisor": host.pk, "key": fields.get("key", "")}
        if action == "destroy":
            params["force"] = bool(fields.get("force"))
        owner = (fields.get("owner") or "").strip()
        if action == "adopt" and owner:
            user = get_user_model().objects.filter(username=owner).first()
            if user is None:
                raise ValidationError({"owner": [f"no user {owner[:50]!r}"]})
            params["owner"] = user.pk
    else:
        params = {"vm": fields.get("vm")}
    return jobs.submit(f"repair.{action}", params, actor=actor, source=source, reason=f"verify repair: {action}")


# --- adopt ------------------------------------------------------------------------------


def _running(host, key):
    """What the host says of ``key`` now (None: it does not run it)."""
    return next((info for info in drivers.driver_for(host).list_vms() if info.key == key), None)


def _known(host, key):
    """The live VM row the key belongs to on any host, if any."""
    match = OUR_KEY.match(key)
    by_id = Q(pk=int(match[1]), host_key="") if match else Q(pk__in=[])
    return VM.objects.filter(by_id | Q(host_key=key, host=host), state__in=VM.LIVE).select_related("host").first()


def adopt(host_id, key, owner_id=None, image_id=None, *, actor):
    """Make the unknown VM ``key`` on the host a vclmgr VM owned by ``owner_id`` (the job
    passes the admin's when none is chosen), with a claim of its size on that host.
    ``Conflict`` when the host no longer runs it, vclmgr knows it, or the host lacks room
    (nothing is written then)."""
    host = Hypervisor.objects.select_related("credential").get(pk=host_id)
    known = _known(host, key)
    if known is not None:
        if known.host_id == host.pk and known.host_key == key:
            return {"vm": known.pk, "note": "adopted already"}
        raise Conflict(f"{key} is vclmgr's VM {known.pk} ({known.state} on {known.host or 'no host'}): not unknown")
    info = _running(host, key)  # no transaction open across the driver call
    if info is None:
        raise Conflict(f"{host.name} no longer runs {key}")
    owner = get_user_model().objects.filter(pk=owner_id).first() if owner_id else None
    with transaction.atomic():
        image = Image.objects.get(pk=image_id) if image_id else _adoption_image(actor)
        vm = VM.objects.create(
            name=key,
            image=image,
            owner=owner,
            host=host,
            host_key=key,
            state=_STATE.get(info.state, VM.State.STOPPED),
            vcpus=max(1, info.vcpus),
            memory_mib=max(16, info.memory_mib),
            disk_gib=0,
            adhoc=True,
        )
        demand = capacity.Demand(
            vcpus=vm.vcpus, memory_mib=vm.memory_mib, disk_gib=0, start=timezone.now(), purpose=f"vm {vm.pk} (adopted)"
        )
        try:
            claim = capacity.claim_on_host(host, demand, actor=actor, owner=owner)
        except capacity.NoCapacity as exc:
            why = refusals.summarize(exc.result.reasons) or exc.result.note or "no room"
            raise Conflict(
                f"cannot adopt {key}: {host.name} has no room for {vm.vcpus} vCPUs, {vm.memory_mib} MiB ({why})"
            ) from None
        VM.objects.filter(pk=vm.pk).update(allocation=claim)
        vm.allocation = claim
        changelog.record(vm, "create", actor, reason=f"adopted from {host.name} after verify ({key})")
        services.emit_vm(vm)
    return {"vm": vm.pk, "allocation": claim.pk}


def _adoption_image(actor):
    """The image an adopted VM is recorded with when none is chosen (inactive: nobody reserves it)."""
    image = Image.objects.filter(name=ADOPTED_IMAGE).first()
    if image is None:
        image = services.create_image(
            actor=actor,
            name=ADOPTED_IMAGE,
            active=False,
            reason="for VMs adopted after verify",
            description="VMs found on hypervisors and adopted by an administrator; not an image to reserve.",
        )
    return image


# --- destroy ----------------------------------------------------------------------------


def destroy(host_id, key, force=False, *, actor):
    """Destroy the unknown VM ``key`` on the host through its driver (idempotent: one that is
    gone already is fine). A name that is not vclmgr's needs ``force``."""
    host = Hypervisor.objects.select_related("credential").get(pk=host_id)
    match = OUR_KEY.match(key)
    if not match and not force:
        raise Conflict(f"{key} is not a vclmgr name (someone made it outside vclmgr): destroy it only with force")
    known = _known(host, key)
    if known is not None:
        raise Conflict(f"{key} is vclmgr's VM {known.pk} ({known.state}): destroy it as a VM, not as unknown")
    drivers.driver_for(host).destroy(key)  # no transaction open across the driver call
    with transaction.atomic():
        changelog.record(
            host, "update", actor, {"destroyed_vm": [key, None]}, f"unknown VM {key} destroyed after verify"
        )
        lost = VM.objects.filter(pk=int(match[1]), host=host, state=VM.State.LOST).first() if match else None
        if lost is not None:
            services.set_state(
                lost.pk, VM.State.DESTROYED, f"removed from {host.name} after its host came back", actor=actor
            )
    return {"destroyed": key, "host": host.pk, "lost_vm": lost.pk if lost else None}


# --- drift and absent -------------------------------------------------------------------


def _state_now(vm):
    if vm.host is None:
        raise Conflict(f"{vm.key} has no host")
    return drivers.driver_for(vm.host).state(vm.key)


def take_host_state(vm_id, *, actor):
    """The database takes the state the hypervisor reports for a built VM."""
    vm = VM.objects.select_related("host", "host__credential").get(pk=vm_id)
    if vm.state not in VM.BUILT:
        raise Conflict(f"{vm.key} is {vm.state}: only a running, stopped or suspended VM can drift")
    now = _state_now(vm)
    if now == base.VMState.ABSENT:
        raise Conflict(f"{vm.key} is absent on {vm.host.name}: mark it gone instead")
    state = _STATE.get(now, VM.State.STOPPED)
    if state == vm.state:
        return {"vm": vm.pk, "state": state, "note": "no drift (any more)"}
    fields = {}
    if state == VM.State.RUNNING:
        fields["address"] = drivers.driver_for(vm.host).address(vm.key) or vm.address
    services.set_state(
        vm.pk, state, f"took {vm.host.name}'s state after verify ({vm.state} → {now})", actor=actor, **fields
    )
    return {"vm": vm.pk, "state": state}


def mark_gone(vm_id, reason="", *, actor):
    """A VM its host does not run (checked again now) is marked destroyed, its claims are
    released and its holders told (its reservation ends with the reason)."""
    vm = VM.objects.select_related("host", "host__credential").get(pk=vm_id)
    if vm.state == VM.State.DESTROYED:
        return {"vm": vm.pk, "note": "gone already"}
    if vm.state not in CHECKED:
        raise Conflict(f"{vm.key} is {vm.state}: a job is changing it; wait for it to end")
    if _state_now(vm) != base.VMState.ABSENT:
        raise Conflict(f"{vm.host.name} runs {vm.key}: it is not absent")
    why = reason or f"{vm.key} vanished from {vm.host.name} (found absent by verify)"
    with transaction.atomic():
        for allocation in (vm.allocation, vm.target_allocation):
            if allocation is not None:
                capacity.release(allocation, actor=actor, reason=why[:500])
        services.set_state(vm.pk, VM.State.DESTROYED, why, error=why[:4000], actor=actor)
        for hook in ON_GONE:
            hook(vm, why, actor=actor)
    return {"vm": vm.pk, "state": VM.State.DESTROYED}
