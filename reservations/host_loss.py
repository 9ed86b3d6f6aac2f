"""Reservations whose host left: future claims re-placed off a host drained or taken offline
(``host_left_service``, ``replace_off_host``; flagged when no other host has room), VMs of a
host that died rebuilt elsewhere or failed (``reprovision_off_host``, Ganeti's harep), a VM
found gone ending its reservation (``vm_gone``), and a moved claim followed (``follow_claim``),
as is a resized VM's size (``follow_size``)."""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from capacity import services as capacity
from core import changelog, events
from core.errors import Conflict
from jobs import services as jobs
from provisioning import private_networks
from provisioning import services as vms
from provisioning.models import VM
from provisioning.opcodes import host_ops as vm_host_ops
from reservations import ending, reserving, settling, status
from reservations.models import Reservation

S = Reservation.Status
NOT_BUILT = (S.REQUESTED, S.PENDING)


def follow_claim(old, new, *, actor):
    """A claim moved (a migration, a build re-placed off a host that left service): the
    reservation holding it points at the one that counts now (registered in ``capacity.ON_MOVED``)."""
    Reservation.objects.filter(allocation_id=old.pk).update(allocation=new, degraded="", updated=timezone.now())


def follow_size(vm, size, *, actor):
    """An operator resized the VM (``provisioning.resizing``): its reservation holds that size
    from now on (its quotas, an extension and a rebuild on another host count it), registered
    in ``resizing.ON_RESIZED``; in the transaction that records the VM's size."""
    for reservation in Reservation.objects.filter(vm_id=vm.pk, status__in=Reservation.ACTIVE):
        before = {name: getattr(reservation, name) for name in size}
        Reservation.objects.filter(pk=reservation.pk).update(**size, updated=timezone.now())
        changes = {name: [before[name], value] for name, value in size.items() if before[name] != value}
        if changes:
            changelog.record(reservation, "update", actor, changes, f"its VM {vm.key} was resized")


def host_left_service(hv, old_state, *, actor):
    """A host was drained or taken offline: submit the job that re-places its future
    reservations (registered in ``inventory.services.ON_STATE_CHANGE``; runs in its transaction)."""
    if hv.state == "online":
        # Back in service: what was flagged for it is safe again where it is.
        for reservation in Reservation.objects.filter(
            allocation__host_id=hv.pk, allocation__released__isnull=True, status__in=NOT_BUILT
        ).exclude(degraded=""):
            Reservation.objects.filter(pk=reservation.pk).update(degraded="", updated=timezone.now())
            reservation.degraded = ""
            status.history(reservation, f"safe again: {hv.name} is back online")
        return None
    if hv.state == "offline" and hv.state_reason.startswith(vm_host_ops.AUTO_OFFLINE) and on_dead_host(hv.pk):
        jobs.submit(
            "node.reprovision",
            {"hypervisor": hv.pk},
            actor=actor,
            reason=f"{hv.name} stopped answering: {hv.state_reason}"[:500],
        )
    if not future_on_host(hv.pk):
        return None
    return jobs.submit(
        "node.replace_reservations",
        {"hypervisor": hv.pk},
        actor=actor,
        reason=f"{hv.name} is {hv.state}: {hv.state_reason}"[:500],
    )


def future_on_host(host_id, now=None):
    """Ids of the accepted, not yet built reservations whose live claim is on the host."""
    return list(
        Reservation.objects.filter(
            status__in=NOT_BUILT,
            vm__isnull=True,
            start__gt=now or timezone.now(),
            allocation__host_id=host_id,
            allocation__released__isnull=True,
        )
        .order_by("start", "pk")
        .values_list("pk", flat=True)
    )


def replace_off_host(reservation_id, host_id, *, actor):
    """Move one future reservation's claim off a host that left service, under the same
    capacity checks as a new one, in one transaction; flag it (and tell its user and the
    admins) when no other host has room. Idempotent: a claim moved already is left alone."""
    from inventory.models import Hypervisor

    host = Hypervisor.objects.get(pk=host_id)
    with transaction.atomic():
        # Locked: a cancel or an end racing this waits, and never leaves a fresh claim behind.
        reservation = Reservation.objects.select_for_update().select_related("image").get(pk=reservation_id)
        allocation = reservation.allocation
        if (
            reservation.status not in NOT_BUILT
            or allocation is None
            or allocation.released is not None
            or allocation.host_id != host_id
            or host.state == Hypervisor.State.ONLINE
        ):
            return {"reservation": reservation_id, "note": "not on that host (or the host is back)"}
        if reservation.environment_id:  # its machines share the host with their networks: not moved one by one
            why = f"{host.name} is {host.state} ({host.state_reason})"
            return _degrade(reservation, f"{why}; an environment's machines are not moved apart from one another")
        size = {"vcpus": reservation.vcpus, "memory_mib": reservation.memory_mib, "disk_gib": reservation.disk_gib}
        demand = vms.demand_for(
            reservation.image,
            size,
            start=reservation.start,
            end=reservation.end,
            purpose=f"reservation {reservation.pk}",
            exclude_hosts=[host_id],
            **reservation.gpu_ask(),
        )
        why = f"{host.name} is {host.state} ({host.state_reason})"
        try:
            fresh = capacity.replace_claim(allocation, demand, actor=actor, reason=f"reservation {reservation.pk}")
        except (capacity.NoCapacity, capacity.TryAgain) as exc:
            text = reserving.plain_refusal(exc.result) if isinstance(exc, capacity.NoCapacity) else str(exc)
            return _degrade(reservation, f"{why}; tried every other host: {text}")
        reservation.refresh_from_db()
        status.history(reservation, f"moved from {host.name} to {fresh.host.name}: {why}")
        events.emit(
            "reservation.moved",
            {"id": reservation.pk, "reason": why, "allocation": fresh.pk, "start": reservation.start.isoformat()},
            status.targets(reservation),
        )
        changelog.record(reservation, "update", actor, {"host": [host.name, fresh.host.name]}, why)
    return {"reservation": reservation_id, "moved": True, "host": fresh.host_id}


def _degrade(reservation, why):
    """Keep the claim where it is (the host may come back before the start), and say so."""
    why = why[:500]
    Reservation.objects.filter(pk=reservation.pk).update(degraded=why, updated=timezone.now())
    reservation.degraded = why
    status.history(reservation, f"endangered: {why}")
    targets = status.targets(reservation)
    events.emit(
        "reservation.degraded", {"id": reservation.pk, "reason": why, "start": reservation.start.isoformat()}, targets
    )
    return {"reservation": reservation.pk, "degraded": True, "reason": why}


BUILDING_OR_READY = (S.PROVISIONING, S.READY)


def on_dead_host(host_id):
    """Ids of the reservations being built or ready whose VM is (was) on the host."""
    return list(
        Reservation.objects.filter(status__in=BUILDING_OR_READY, vm__host_id=host_id, vm__state__in=VM.LIVE)
        .order_by("start", "pk")
        .values_list("pk", flat=True)
    )


def reprovision_off_host(reservation_id, host_id, *, actor):
    """The host of the reservation's VM stopped answering and is offline: the VM is ``lost``
    (its claims released; the row stays for verify to clean up if the host returns) and, per
    its image's ``on_host_failure``, the reservation is rebuilt from its image on another host
    (a new claim to the same end, then ``vm.create``) or fails with the reason. One
    transaction: on any error nothing is changed. Idempotent: a reservation already moved on
    is left alone. Its user is told (history, ``reservation.host_lost``)."""
    from inventory.models import Hypervisor

    host = Hypervisor.objects.get(pk=host_id)
    with transaction.atomic():
        # An environment's head is locked before the machine: the order every path that
        # rebuilds several of its machines locks them in (``settling.lock_head``).
        unlocked = Reservation.objects.filter(pk=reservation_id).only("pk", "head_id", "environment_id").first()
        if unlocked is not None and unlocked.environment_id:
            settling.lock_head(unlocked)
        rows = Reservation.objects.select_for_update(of=("self",)).select_related("image", "vm")
        reservation = rows.get(pk=reservation_id)
        vm = reservation.vm
        if (
            reservation.status not in BUILDING_OR_READY
            or vm is None
            or vm.host_id != host_id
            or vm.state not in VM.LIVE
            or host.state != Hypervisor.State.OFFLINE
        ):
            return {"reservation": reservation_id, "note": "not on that host any more (or the host is back)"}
        why = f"its host {host.name} stopped answering ({host.state_reason})"
        vms.mark_lost(vm.pk, f"lost with its host {host.name}"[:500], actor=actor)
        if reservation.allocation_id and reservation.allocation_id != vm.allocation_id:
            capacity.release(reservation.allocation, actor=actor, reason=f"reservation {reservation.pk}: {why}"[:500])
        if reservation.image.on_host_failure == "fail":
            return _lost(reservation, f"{why}; its image's policy is to fail, not to rebuild", host)
        if reservation.environment_id:  # rebuilt with the machines its networks join it to, never alone
            return _environment_lost(reservation, host, why, actor=actor)
        if reservation.end <= timezone.now():
            return _lost(reservation, f"{why}; its time is over", host)
        try:
            with transaction.atomic():
                return _rebuild(reservation, host, why, actor=actor)
        except (capacity.NoCapacity, capacity.TryAgain, ValidationError) as exc:
            if isinstance(exc, capacity.NoCapacity):
                text = reserving.plain_refusal(exc.result)
            else:
                text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
            return _lost(reservation, f"{why}; it could not be rebuilt elsewhere: {text}", host)


def _environment_lost(machine, host, why, *, actor):
    """A machine of an environment was on the dead host: every machine of it there is lost with
    it (their claims released; nothing is asked of the dead host), then each group of them (a
    machine with those its networks join it to) is built again on another host as a failed
    build is (``settling.machine_failed``): once, with the rest of its group wherever that is;
    when a group cannot be, the whole environment fails with the reason and nothing of it stays
    on any host."""
    head_id = machine.head_id or machine.pk
    family = Reservation.objects.filter(Q(pk=head_id) | Q(head_id=head_id), status__in=BUILDING_OR_READY)
    here = [machine, *family.filter(vm__host_id=host.pk, vm__state__in=VM.LIVE).exclude(pk=machine.pk)]
    for other in here[1:]:
        vms.mark_lost(other.vm_id, f"lost with its host {host.name}"[:500], actor=actor)
    done, seen = None, set()
    for row in here:
        if row.hostname in seen:  # (rebuilt with a machine before it)
            continue
        seen |= private_networks.group_of(f"env{head_id}", row.hostname)[0]
        row = Reservation.objects.select_related("vm", "allocation__host", "image").get(pk=row.pk)
        done = settling.machine_failed(row, sorted({*row.failed_hosts, host.pk}), why, actor=actor)
        failed = done["status"] == S.FAILED
        _host_lost_event(row, host, done.get("error", why)[:500], "failed" if failed else "rebuilding")
        if failed:
            return {"reservation": machine.pk, "failed": True, "reason": done["error"][:500]}
    return {"reservation": machine.pk, "rebuilt": True, "host": done.get("host")}


def _rebuild(reservation, host, why, *, actor):
    size = {"vcpus": reservation.vcpus, "memory_mib": reservation.memory_mib, "disk_gib": reservation.disk_gib}
    failed = sorted({*reservation.failed_hosts, host.pk})
    demand = vms.demand_for(
        reservation.image,
        size,
        start=max(reservation.start, timezone.now()),
        end=reservation.end,
        purpose=f"reservation {reservation.pk}",
        exclude_hosts=failed,
        **reservation.gpu_ask(),
    )
    allocation = capacity.claim(demand, actor=actor, owner=reservation.user)
    moved = status.move(
        reservation.pk,
        BUILDING_OR_READY,
        S.PLACING,
        f"rebuilding on {allocation.host.name}: {why}",
        allocation=allocation,
        vm=None,
        attempts=0,
        failed_hosts=failed,
        error="",
    )
    if moved is None:
        raise Conflict(f"reservation {reservation.pk} changed meanwhile")
    changelog.record(moved, "update", actor, {"host": [host.name, allocation.host.name]}, why)
    _host_lost_event(moved, host, why, "rebuilding")
    reserving.provision(moved.pk, f"rebuilding from image {moved.image.name} on {allocation.host.name}", actor=actor)
    return {"reservation": moved.pk, "rebuilt": True, "host": allocation.host_id}


def _lost(reservation, why, host):
    why = why[:500]
    moved = status.move(reservation.pk, BUILDING_OR_READY, S.FAILED, f"failed: {why}", error=why, connect_secret="")
    _host_lost_event(moved or reservation, host, why, "failed")
    return {"reservation": reservation.pk, "failed": True, "reason": why}


def _host_lost_event(reservation, host, why, outcome):
    """For others to hook (e-mail): the reservation's VM was lost with its host; ``outcome``
    says what happens now (``rebuilding`` or ``failed``)."""
    events.emit(
        "reservation.host_lost",
        {"id": reservation.pk, "host": host.name, "outcome": outcome, "reason": why, "user": reservation.user_id},
        status.targets(reservation),
    )


def vm_gone(vm, reason, *, actor):
    """A VM found gone from its host (verify's repair; registered in ``repair.ON_GONE``):
    its reservation ends with the reason (its claims were released with the VM); an environment's
    machine ends its whole environment."""
    for reservation in Reservation.objects.filter(vm=vm, status__in=(*Reservation.ACTIVE, S.ENDING)):
        done = status.move(
            reservation.pk,
            (*Reservation.ACTIVE, S.ENDING),
            S.ENDED,
            f"ended: {reason}",
            error=reason[:4000],
            connect_secret="",
        )
        if done is not None:
            ending.release(done, f"reservation ended: {reason}"[:500], actor=actor)
            changelog.record(done, "update", actor, {"status": [reservation.status, S.ENDED]}, reason[:500])
            if done.environment_id:
                why = f"the environment failed: {done.hostname}: {reason}"
                ending.end_environment(done, why, actor=actor)
