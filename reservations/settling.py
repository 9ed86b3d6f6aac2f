"""The reservation follows its VM's build: ``settle`` after a ``vm.create`` ended (ready, retried
once on another host — an environment's machine with the machines that share its host —, or
failed), ``settle_built`` in the build's last step, ``settle_unbuilt``
when a build ends otherwise (a ``reservation.settle`` job queued). Idempotent."""

from django.db import transaction
from django.utils import timezone

from capacity import services as capacity
from core.changelog import Actor
from environments import placing
from jobs import services as jobs
from jobs.models import Job
from provisioning import private_networks
from provisioning import services as vms
from provisioning.models import VM
from reservations import ending, environments, idle, logins, reserving, status
from reservations.models import Reservation

S = Reservation.Status
MAX_ATTEMPTS = 2  # a VM that fails to build is retried once on another host
# How a pooled image's VM came (``provisioning.warm``), in the trail of its reservation's ready.
HOW = {VM.Warm.HIT: ", warm from the pool", VM.Warm.MISS: ", built cold"}


def settle(reservation_id, *, actor):
    """After a ``vm.create`` ended: ready, retry on another host, or failed. Idempotent."""
    return _settle(Reservation.objects.select_related("vm", "vm__host", "image").get(pk=reservation_id), actor=actor)


BUILDING = (VM.State.STAGING, VM.State.DEFINING, VM.State.STARTING)
ALIVE = (S.PROVISIONING, S.READY)  # a machine retried: failed in its build, or ready on a host that died


def _settle(reservation, *, actor):
    """``settle`` of the row as read (with its VM, the VM's host and its image)."""
    vm = reservation.vm
    if reservation.status != S.PROVISIONING or vm is None:
        return {"status": reservation.status, "note": "nothing to settle"}
    if reservation.environment_id:
        lock_head(reservation)  # before anything of its machines is written (see there)
    if vm.state == VM.State.RUNNING:
        if reservation.environment_id:  # the head turns ready with the last of its machines
            return environments.machine_ready(reservation, lambda row: _ready(row, row.vm, actor=actor))
        return _ready(reservation, vm, actor=actor)
    if vm.state in BUILDING and not _build_pending(vm):
        # Its build ended without finishing it or cleaning up (canceled between steps, given up
        # after its workers or database sessions were lost): it may be half made on its host.
        # In error it keeps its claims until the destroy queued here removes it (the build's own
        # undo, which did not run); the reservation goes on as below.
        vm = vms.cleanup_failed(vm.pk, f"its build ended with the VM {vm.state}", actor=actor)
        why = f"reservation {reservation.pk}: its build ended unfinished"
        jobs.submit("vm.destroy", {"vm": vm.pk}, actor=actor, submitter=reservation.user, reason=why)
    elif vm.state == VM.State.REQUESTED and not _build_pending(vm):
        # Given up before define (workers or database sessions lost at every attempt): nothing
        # of it is on a host, so its claim goes back now, before a retry claims again.
        vm = vms.fail_build(vm.pk, "its build was given up before it defined the VM", "build given up", actor=actor)
    building = vm.state in VM.LIVE and vm.state != VM.State.ERROR
    if building or (vm.state == VM.State.REQUESTED and _build_pending(vm)):  # (a settle run early): wait
        return {"status": reservation.status, "vm": vm.state}
    failed = [*reservation.failed_hosts, *([vm.host_id] if vm.host_id else [])]
    why = vm.error or f"the VM ended {vm.state}"
    if reservation.environment_id:
        return machine_failed(reservation, failed, why, actor=actor)
    if reservation.attempts >= MAX_ATTEMPTS or reservation.end <= timezone.now():
        status.move(reservation.pk, S.PROVISIONING, S.FAILED, f"failed: {why}", error=why[:4000], failed_hosts=failed)
        ending.release(reservation, "reservation failed", actor=actor)
        return {"status": S.FAILED, "error": why}
    return _retry_elsewhere(reservation, failed, why, actor=actor)


def lock_head(reservation):
    """The row of the head of ``reservation``'s environment, locked (``reservation`` may be the
    head). The lock order of an environment: its head first, then any of its machines. Every
    path that may change several of them takes it before writing any machine's row (its VM's
    included): a settle of a machine's build (``_settle``), a host's loss (``host_loss``), a
    machine turning ready (``environments.machine_ready``). A settle of machine N rebuilding
    M with it and a host loss of M rebuilding N with it would otherwise each hold one
    machine's row and wait for the other's (a deadlock on PostgreSQL); now the second waits
    at the head, then sees what the first did."""
    head_id = reservation.head_id or reservation.pk
    return Reservation.objects.select_for_update(of=("self",)).get(pk=head_id)


def machine_failed(reservation, failed, why, *, actor):
    """A machine of an environment failed to build, or its host died under it (``host_loss``):
    built again on another host with the machines its networks join it to there
    (``_rebuild_group``), once; when no host has room for all of them, or that retry was spent,
    the whole environment fails, saying which machine and why, and nothing of it stays on any
    host. ``failed``: the hosts it failed on."""
    if reservation.attempts >= MAX_ATTEMPTS:
        note = f"{why}; it had been retried once already"
    elif reservation.end <= timezone.now():
        note = why
    else:
        rebuilt = _rebuild_group(reservation, failed, why, actor=actor)
        if isinstance(rebuilt, dict):
            return rebuilt
        note = f"{why}; no other host for a retry: {rebuilt}"
    status.move(reservation.pk, ALIVE, S.FAILED, f"failed: {note}", error=note[:4000], failed_hosts=failed)
    ending.release(reservation, "reservation failed", actor=actor)
    ending.end_environment(
        reservation, f"the environment failed: {reservation.hostname} could not be built ({note})", actor=actor
    )
    return {"status": S.FAILED, "error": note}


def _rebuild_group(reservation, failed, why, *, actor):
    """Claim ``reservation``'s machine and those its networks join it to (they share a host, or
    hosts of one overlay) again, as one gang for the rest of the window, off the hosts any of
    them failed on; record their networks there and build them there: what was made of them
    before is torn down (``vm.destroy``, which removes the networks with the last VM). The
    environment's other machines stay. Returns the settle's answer, or why it could not (a
    string: the environment fails)."""
    head_id = reservation.head_id or reservation.pk
    head = lock_head(reservation)  # one machine's failure at a time (the callers took it first already)
    if not Reservation.objects.filter(pk=reservation.pk, status__in=ALIVE, vm_id=reservation.vm_id).exists():
        return {"status": reservation.status, "note": "settled meanwhile"}
    if head.status not in (S.PROVISIONING, S.READY):
        return f"its environment is {head.status}"
    old_host = reservation.allocation.host
    names, networks = private_networks.group_of(f"env{head_id}", reservation.hostname)
    group = [m for m in environments.machines_of(head) if m.hostname in names]
    spent = [m.hostname for m in group if m.attempts >= MAX_ATTEMPTS]
    if spent:
        return f"{', '.join(spent)}, on its networks, had been retried once already"
    excluded = {old_host.pk, *failed}.union(*(m.failed_hosts for m in group))
    try:
        with transaction.atomic():
            claims = placing.claim_again(
                {m.hostname: m for m in group},
                networks,
                excluded,
                reservation.attempts + 1,
                start=max(group[0].start, timezone.now()),
                purposes={m.hostname: f"reservation {m.pk}" for m in group},
                actor=actor,
                owner=head.user,
                gang_id=f"environment reservation {head_id}",
                old_claims=placing.claims_to_give_back(
                    [m.vm for m in group if m.vm is not None], also=[m.allocation_id for m in group]
                ),
            )
            new_host = claims[reservation.hostname].host
            where = " and ".join(sorted({claim.host.name for claim in claims.values()}))
            hostnames = ", ".join(sorted(names))
            words = f"{hostnames} on {where} after {reservation.hostname} failed on {old_host.name}: {why}"
            for machine in group:
                _move_machine(machine, reservation, claims[machine.hostname], old_host, words, actor=actor)
            if head.hostname not in names:
                status.history(head, f"building {words}")
    except placing.Refused as exc:
        return exc.words
    return {"status": S.PROVISIONING, "retry": True, "host": new_host.pk, "machines": sorted(names)}


def _move_machine(machine, failed, allocation, old_host, words, *, actor):
    """One machine of the group onto its new claim: its old claim given back (the failed one's
    now; another's with its VM, torn down by a job), then built there."""
    old_vm = machine.vm
    gone = (VM.State.DESTROYED, VM.State.FAILED, VM.State.LOST)  # (lost: its host is dead, no destroy there)
    if machine.pk != failed.pk and old_vm is not None and old_vm.state not in gone:  # (its build may be queued)
        why = f"reservation {machine.pk}: rebuilt elsewhere with {failed.hostname}"
        jobs.submit("vm.destroy", {"vm": old_vm.pk}, actor=actor, submitter=machine.user, reason=why, savepoint=False)
    else:
        ending.release(machine, "building again on another host", actor=actor)
    hosts = [*machine.failed_hosts, old_host.pk] if machine.pk == failed.pk else machine.failed_hosts
    moved = status.move(
        machine.pk,
        (S.PROVISIONING, S.READY),
        S.PLACING,
        f"retrying on another host: {words}",
        savepoint=False,
        failed_hosts=list(dict.fromkeys(hosts)),
        allocation=allocation,
    )
    if moved is None:  # ended meanwhile: the new claims roll back with the rest
        raise placing.Refused(f"{machine.hostname} is no longer being built", {})
    reserving.provision(machine.pk, f"retrying {words}", actor=actor, savepoint=False)


def _build_pending(vm):
    """Is a ``vm.create`` of this VM queued, waiting or running (its retry, its continuation)?"""
    return Job.objects.filter(opcode="vm.create", params__vm=vm.pk).exclude(status__in=Job.FINAL).exists()


def settle_built(vm, job_id, *, actor):
    """A ``vm.create`` succeeded (``lifecycle.ON_BUILT``: in the transaction of its last step,
    which ends it, holding the queue lock): its reservation turns ready there, with no job of
    its own; both commit or neither does (a lost lease rolls both back)."""
    rows = Reservation.objects.select_related("vm", "vm__host", "image").filter(vm_id=vm.pk, status=S.PROVISIONING)
    reservation = idle.with_policy(rows).first()  # (its idle policy read with it, for its ready)
    if reservation is not None:
        _settle(reservation, actor=Actor(name=f"job {job_id}"))


def settle_unbuilt(job):
    """A ``vm.create`` ended other than in success (``transitions.on_end``: failed, canceled,
    given up after lost workers; in the transaction that ends it): queue ``reservation.settle``
    for the reservation it was building, then, so that it settles (retry elsewhere, or failed)
    even if nothing else happens. (Its success settled it in its last step: ``settle_built``.)"""
    if job.status == Job.Status.SUCCESS:
        return
    vm_id = Job.objects.filter(pk=job.id).values_list("params__vm", flat=True).first()
    if not vm_id:
        return
    reservation = Reservation.objects.select_related("user").filter(vm_id=vm_id, status=S.PROVISIONING).first()
    if reservation is None:  # an ad-hoc VM's, or its reservation has moved on
        return
    queued = Job.objects.filter(opcode=reserving.SETTLE, status__in=Job.PENDING, params__reservation=reservation.pk)
    if queued.exists():  # (a continued build's child and parent both end: once is enough)
        return
    jobs.submit(
        reserving.SETTLE,
        {"reservation": reservation.pk},
        actor=Actor(name=f"job {job.id}"),
        submitter=reservation.user,
        reason=f"reservation {reservation.pk}: its build, job {job.id}, ended {job.status}",
        savepoint=False,
    )


def _retry_elsewhere(reservation, failed_hosts, why, *, actor):
    """Claim again, avoiding the hosts that failed, and build again (once)."""
    if (
        status.move(
            reservation.pk, S.PROVISIONING, S.PLACING, f"retrying on another host: {why}", failed_hosts=failed_hosts
        )
        is None
    ):
        return {"status": reservation.status}
    start = max(reservation.start, timezone.now())
    size = {"vcpus": reservation.vcpus, "memory_mib": reservation.memory_mib, "disk_gib": reservation.disk_gib}
    demand = vms.demand_for(
        reservation.image,
        size,
        start=start,
        end=reservation.end,
        purpose=f"reservation {reservation.pk}",
        exclude_hosts=failed_hosts,
        **reservation.gpu_ask(),
    )
    try:
        with transaction.atomic():
            allocation = capacity.claim(demand, actor=actor, owner=reservation.user)
            Reservation.objects.filter(pk=reservation.pk).update(allocation=allocation)
    except (capacity.NoCapacity, capacity.TryAgain) as exc:
        text = reserving.plain_refusal(exc.result) if isinstance(exc, capacity.NoCapacity) else str(exc)
        error = f"{why}; no other host for a retry: {text}"
        status.move(reservation.pk, S.PLACING, S.FAILED, f"failed: {error}", error=error[:4000])
        return {"status": S.FAILED, "error": error}
    reserving.provision(reservation.pk, f"retrying on {allocation.host.name} after: {why}", actor=actor)
    return {"status": S.PROVISIONING, "retry": True, "host": allocation.host_id}


def _ready(reservation, vm, *, actor):
    status.move(
        reservation,
        S.PROVISIONING,
        S.READY,
        f"ready on {vm.host.name if vm.host else '?'} at {vm.address or 'an unknown address'}{HOW.get(vm.warm, '')}",
        savepoint=False,  # in the settle step's transaction, which catches nothing
        **logins.fields_lacking(reservation),
        **idle.arm(reservation, timezone.now()),
        error="",
    )
    return {"status": S.READY, "vm": vm.pk, "address": vm.address}


def build_job(reservation):
    """The job building the reservation's current VM (None before building starts)."""
    from jobs.models import Job

    if not reservation.vm_id:
        return None
    return Job.objects.filter(opcode="vm.create", params__vm=reservation.vm_id).order_by("-id").first()
