"""How a reservation ends: ``end`` (its VM torn down or reverted by a job, then ``finish``),
``cancel`` (one not yet built), ``extend`` (its end moved later, under the quotas and the host's
room), and ``release`` (its claims given back, except what a VM still on its host holds)."""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from capacity import services as capacity
from capacity.models import Allocation
from core import changelog
from core.changelog import Actor
from core.errors import Conflict
from jobs import services as jobs
from provisioning import quotas
from provisioning import services as vms
from provisioning.models import VM
from reservations import environments, reserving, status
from reservations.models import Reservation

S = Reservation.Status


def end(reservation, reason="ended by the user", *, actor, whole=False):
    """End a reservation now (or at its end time, from the tick): tear its VM down or revert it.

    A future one that has not started is canceled instead; a final one is left as it is. An
    environment's head ends every machine of it, in one transaction; a machine alone is ended
    only as part of its environment (``whole``: the caller ends them all).
    """
    actor = Actor.of(actor)
    if reservation.environment_id and not whole:
        environments.check_acting_on(reservation)
        with transaction.atomic():
            job = end(reservation, reason, actor=actor, whole=True)
            for machine in Reservation.objects.filter(head=reservation, status__in=Reservation.ACTIVE):
                try:
                    end(machine, reason, actor=actor, whole=True)
                except Conflict:  # (a machine that ended meanwhile)
                    pass
        return job
    if reservation.status in Reservation.FINAL or reservation.status == S.ENDING:
        raise Conflict(f"reservation {reservation.pk} is already {reservation.status}")
    if reservation.status in (S.REQUESTED, S.PENDING):
        return cancel(reservation, reason, actor=actor, whole=True)
    # One transaction: "ending" with no teardown queued would be a reservation nothing ends.
    with transaction.atomic():
        moved = status.move(reservation.pk, Reservation.ACTIVE, S.ENDING, reason, savepoint=False)
        if moved is None:
            raise Conflict(f"reservation {reservation.pk} changed meanwhile; reload")
        vm = moved.vm
        # A VM still requested has its build queued: that build would make it after the end, so
        # it is torn down too (its destroy waits for the build's lock, or the build finds it gone).
        if vm is None or vm.state not in (*VM.LIVE, VM.State.REQUESTED):
            _finish(moved, "nothing to tear down", actor=actor)
            return None
        # A template's VM, or one of a revision under test, is never parked for the next user.
        parkable = moved.template_of_id is None and moved.revision_id is None
        if parkable and moved.image.revert_on_end and vms.has_clean_snapshot(vm) and vm.state in VM.BUILT:
            # The system's job: it ends with the VM owned by no one (a re-run must not be refused).
            job = jobs.submit("vm.park", {"vm": vm.pk}, actor=actor, reason=f"reservation {moved.pk} ended")
        elif parkable and vm.warm == VM.Warm.HIT and vms.has_warm_snapshot(vm) and vm.state == VM.State.RUNNING:
            # Taken warm: reverted to its warm snapshot and back in the pool (or destroyed).
            job = jobs.submit("vm.rewarm", {"vm": vm.pk}, actor=actor, reason=f"reservation {moved.pk} ended")
        else:
            job = jobs.submit(
                "vm.destroy", {"vm": vm.pk}, actor=actor, submitter=moved.user, reason=f"reservation {moved.pk} ended"
            )
        jobs.submit(
            "reservation.finish",
            {"reservation": moved.pk},
            actor=actor,
            submitter=moved.user,
            reason=f"reservation {moved.pk}: after teardown",
            depends=[(job.pk, [])],
        )
    return job


def end_environment(machine, reason, *, actor):
    """One machine of an environment cannot go on (its build failed, its host died): every other
    machine of it still active ends too, and the head keeps the reason as its error."""
    head_id = machine.head_id or machine.pk
    Reservation.objects.filter(pk=head_id).update(error=reason[:4000])
    for other in Reservation.objects.filter(Q(pk=head_id) | Q(head_id=head_id), status__in=Reservation.ACTIVE):
        try:
            end(other, reason, actor=actor, whole=True)
        except Conflict:  # ended meanwhile
            pass


def finish(reservation_id, *, actor):
    """After the teardown job: ended, capacity released. Idempotent."""
    reservation = Reservation.objects.select_related("vm", "allocation").get(pk=reservation_id)
    if reservation.status != S.ENDING:
        return {"status": reservation.status}
    vm = reservation.vm
    note = "VM destroyed" if vm is None or vm.state == VM.State.DESTROYED else f"VM {vm.state}"
    if vm is not None and vm.state == VM.State.STOPPED and reservation.image.revert_on_end:
        note = "VM reverted to its clean state and stopped"
    if vm is not None and vm.warm == VM.Warm.WARM:
        note = "VM reverted to its warm state, back in the pool"
    with transaction.atomic():
        if vm is not None and _teardown_failed(vm):  # its claim stays with the VM (error) for repair
            if vm.state != VM.State.ERROR:
                vms.cleanup_failed(vm.pk, f"reservation {reservation.pk} ended but its VM is {vm.state}", actor=actor)
            note = "the VM could not be removed; its capacity stays claimed until it is"
        _finish(reservation, note, actor=actor)
    return {"status": S.ENDED, "note": note}


def _teardown_failed(vm):
    """Is the VM still there after its teardown job (anything but destroyed, cleaned up after
    a failed build, or reverted and stopped, which keeps it defined without a claim)?"""
    if vm.warm == VM.Warm.WARM and vm.state == VM.State.RUNNING:  # reverted, back in the warm pool
        return False
    return vm.state not in (VM.State.DESTROYED, VM.State.FAILED, VM.State.REQUESTED, VM.State.STOPPED)


def _finish(reservation, note, *, actor):
    done = status.move(reservation.pk, S.ENDING, S.ENDED, f"ended: {note}", connect_secret="")
    if done is not None:
        release(done, "reservation ended", actor=actor)


def cancel(reservation, reason="canceled by the user", *, actor, whole=False):
    """Cancel a reservation that has not started building; its capacity is given back. An
    environment's head cancels every machine of it (``whole``: as ``end``'s)."""
    actor = Actor.of(actor)
    if reservation.environment_id and not whole:
        environments.check_acting_on(reservation)
        with transaction.atomic():
            done = cancel(reservation, reason, actor=actor, whole=True)
            for machine in Reservation.objects.filter(head=reservation, status__in=(S.REQUESTED, S.PENDING)):
                cancel(machine, reason, actor=actor, whole=True)
        return done
    with transaction.atomic():
        done = status.move(reservation.pk, (S.REQUESTED, S.PENDING), S.CANCELED, reason)
        if done is None:
            raise Conflict(
                f"reservation {reservation.pk} is {reservation.status}: only one that has not started can be "
                "canceled; end it instead"
            )
        release(done, "reservation canceled", actor=actor)
        if done.environment_id and done.head_id is None:  # (however its end came: the tick, a block's)
            environments.forget_networks(done)
    return done


def extend(reservation, new_end, *, actor, whole=False):
    """Move the end later if the host still has room then; ``ValidationError`` saying why not.
    An environment's head moves every machine's end, all or none (``whole``: as ``end``'s)."""
    actor = Actor.of(actor)
    if reservation.environment_id and not whole:
        environments.check_acting_on(reservation)
        with transaction.atomic():
            if reservation.status in Reservation.ACTIVE and new_end > reservation.end:
                environments.check_extension(reservation, new_end)  # once, for every machine
            for machine in Reservation.objects.filter(head=reservation, status__in=Reservation.ACTIVE):
                try:
                    extend(machine, new_end, actor=actor, whole=True)
                except ValidationError as exc:
                    words = [f"{machine.hostname}: {m}" for messages in exc.message_dict.values() for m in messages]
                    raise ValidationError({"end": words}) from None
            return extend(reservation, new_end, actor=actor, whole=True)
    if reservation.status not in Reservation.ACTIVE or reservation.allocation_id is None:
        raise Conflict(f"reservation {reservation.pk} is {reservation.status}: it cannot be extended")
    if new_end <= reservation.end:
        raise ValidationError({"end": ["the new end must be later than the current one"]})
    allocation = reservation.allocation
    size = {"vcpus": reservation.vcpus, "memory_mib": reservation.memory_mib}
    with transaction.atomic():
        # The new window is a new holding: counted against every limit (the reservation's own
        # old window aside) under the same locks as ``reserve``, in this transaction. An image's
        # template is not a holding (``templates``): only the host's room limits it. An
        # environment's machines were counted together (``environments.check_extension``).
        if reservation.template_of_id is None and not reservation.environment_id:
            quotas.check_locked(
                reservation.user,
                reservation.image,
                reservation.start,
                new_end,
                size,
                exclude=("reservation", reservation.pk),
            )
            over = reserving.budget_errors(
                reservation.user, reservation.image, reservation.start, new_end, exclude=("reservation", reservation.pk)
            )
            if over:
                raise ValidationError(over)
        try:
            fresh = capacity.extend(allocation, new_end, actor=actor)
        except capacity.NoCapacity as exc:
            why = reserving.plain_refusal(exc.result)
            raise ValidationError(
                {"end": [f"cannot extend to {timezone.localtime(new_end):%Y-%m-%d %H:%M %Z}: {why} on this VM's host"]}
            ) from None
        except capacity.Released:
            raise Conflict(f"reservation {reservation.pk} changed meanwhile; reload") from None
        # Conditional: an end or cancel committed since ``reservation`` was read must win, and
        # roll this transaction (the fresh claim with it) back instead of leaving it unreleased.
        updated = Reservation.objects.filter(
            pk=reservation.pk, status__in=Reservation.ACTIVE, allocation_id=allocation.pk
        ).update(end=new_end, allocation=fresh, warned=False)
        if updated != 1:
            raise Conflict(f"reservation {reservation.pk} changed meanwhile; reload")
        if reservation.vm_id:
            VM.objects.filter(pk=reservation.vm_id).update(end=new_end, allocation=fresh)
        reservation.refresh_from_db()
        changelog.record(reservation, "update", actor, {"end": [str(allocation.end), str(new_end)]}, "extended")
        status.history(reservation, f"extended to {new_end:%Y-%m-%d %H:%M} UTC")
    return reservation


def held_claims():
    """The claims reservations hold, as a Q on Allocation (verify: a claim nobody holds is an orphan)."""
    return Q(reservations__status__in=Reservation.ACTIVE)


def release(reservation, reason, *, actor):
    """Give back the reservation's claim, and its VM's if that is another (a migrated VM claimed
    on its new host): a VM left defined (reverted) must hold no claim it could run on. A VM
    in ``error`` may still be on its host: its claims stay for verify/repair; a parked VM's
    claim of its disk stays with it (``vms.park``), and a VM back in its warm pool keeps the
    claim it went back on."""
    held = {reservation.allocation_id}
    kept = set()  # a VM whose removal failed (error) keeps its claims until a destroy succeeds
    if reservation.vm_id:
        vm = VM.objects.filter(pk=reservation.vm_id).values("allocation_id", "target_allocation_id", "state").first()
        if vm is not None:
            held.add(vm["allocation_id"])
            if vm["state"] == VM.State.ERROR:
                kept = {vm["allocation_id"], vm["target_allocation_id"]}
    for allocation in Allocation.objects.filter(pk__in=held - kept - {None}):
        if not vms.is_parked_claim(allocation) and not allocation.yields:  # (a VM back in the warm pool)
            capacity.release(allocation, actor=actor, reason=reason)
