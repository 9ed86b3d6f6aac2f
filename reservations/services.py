"""Reserve, check, extend, end, cancel; block allocations; quotas; the scheduler's tick.

One function per verb; the web pages, the API, the CLI and the jobs call these. Rules:

- Validation comes first and names the field and, for a quota, the rule; nothing is written
  when anything is wrong (Django ``ValidationError`` with per-field messages).
- A reservation claims its capacity when it is accepted, for its whole window, in the
  transaction that creates it: a future reservation is as sure as one for now, and a request
  that does not fit is refused with the earliest start that would.
- Hypervisors are never called here: building, reverting and destroying VMs are jobs
  (``vm.*`` from the VM app, ``reservation.*`` in ``reservations.opcodes``).
- Every status change is recorded in the history with its reason, and emitted as an event
  (``reservation.changed``) to the reservation's owner, its own topic and the dashboard.
- A status change is a conditional UPDATE (``_move``, ``extend``): of two racing verbs one wins,
  the other gets ``Conflict`` and writes nothing. The acting user is the keyword ``actor=``.
"""

import logging
import secrets
from dataclasses import dataclass, field, replace
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from accounts import access
from capacity import preemption
from capacity import services as capacity
from capacity.models import Allocation
from core import changelog, events, topics
from core.changelog import Actor
from core.errors import Conflict
from drivers import cloudinit
from jobs import services as jobs
from jobs import transitions
from jobs.models import Job
from placement import refusals as placement_reasons
from placement.result import format_time
from provisioning import quotas
from provisioning import services as vms
from provisioning.models import VM
from provisioning.opcodes import host_ops as vm_host_ops
from reservations import idle, usage
from reservations.models import BlockAllocation, Refusal, Reservation, ReservationHistory

log = logging.getLogger(__name__)
S = Reservation.Status
START_GRACE = timedelta(minutes=2)  # a form filled in at 10:00 and sent at 10:01 still means "now"
MAX_ATTEMPTS = 2  # a VM that fails to build is retried once on another host


# --- who sees what ----------------------------------------------------------------------


def visible(user):
    """A user's own reservations; an instructor's also those of their groups' blocks; all for
    auditors and administrators."""
    if access.can(user, "see_all"):
        return Reservation.objects.all()
    if access.can(user, "teach"):
        return Reservation.objects.filter(Q(user=user) | Q(block__group__in=access.teaching_groups(user))).distinct()
    return Reservation.objects.filter(user=user)


def may_see(user, rest):
    """Topic authoriser for ``reservation.<id>``: whoever may see it (``visible``)."""
    if not rest.isdigit() or len(rest) > 18:
        return False
    return visible(user).filter(pk=int(rest)).exists()


# --- limits: the one quota engine (``provisioning.quotas``) counts reservations as one holder


def holdings(window):
    """The quota engine's holder for reservations (registered at start-up): each active one
    overlapping the window, as ``(vcpus, memory_mib)``."""
    rows = Reservation.objects.filter(status__in=Reservation.ACTIVE, end__gt=window.start)
    if window.end is not None:  # None: open-ended (a staff VM's), every later one overlaps
        rows = rows.filter(start__lt=window.end)
    rows = window.narrow(rows, "reservation")
    return rows.values_list("vcpus", "memory_mib")


# --- checking and placing ---------------------------------------------------------------


@dataclass
class Fit:
    """The answer to "would this fit?", in plain words for the form."""

    fits: bool
    message: str
    earliest: object = None  # a datetime, or None (fits as asked, or never)
    reasons: dict = field(default_factory=dict)

    def as_dict(self):
        return {
            "fits": self.fits,
            "message": self.message,
            "earliest": self.earliest.isoformat() if self.earliest else None,
            "reasons": self.reasons,
        }


def _plain(result):
    """A placement refusal in words a user understands."""
    why = "; ".join(n for n in (placement_reasons.summarize(result.reasons), result.note) if n) or "no hosts"
    return f"no host has room then ({why})"


def _no_capacity_message(result, start):
    text = _plain(result)
    fit = result.earliest_fit
    if fit is not None and fit.start is not None:
        return f"{text}; the earliest start that fits is {format_time(fit.start)} UTC"
    return f"{text}; it does not fit at any time soon"


def check_fit(image, start, end, **size):
    """Would an ``image`` VM fit over ``[start, end)``? Writes nothing."""
    from datetime import UTC, datetime

    demand = vms.demand_for(image, vms.size_for(image, **size), start=start, end=end, purpose="check")
    result = capacity.plan(replace(demand, rank=_rank(start)))
    if result.ok:
        woken = result.note.startswith(capacity.WAKE_NOTE)
        return Fit(True, f"{result.note}" if woken else "fits: a host has room for the whole time")
    suspending = capacity.preemption_note(result)
    if suspending:
        return Fit(True, suspending)
    earliest = None
    if result.earliest_fit is not None and result.earliest_fit.start is not None:
        earliest = datetime.fromtimestamp(result.earliest_fit.start, UTC)
    return Fit(False, _no_capacity_message(result, start), earliest, dict(result.reasons))


class QuotaRefused(ValidationError):
    """A request over a quota (internal to ``validate``: the usage report counts it)."""


def validate(user, image, start, end, now=None, size=None, *, quota=True):
    """Per-field errors for a reservation request (empty: acceptable, capacity aside).

    ``quota`` False: the quotas are left out (``reserve`` counts them once, under their locks).
    """
    try:
        return _validate(user, image, start, end, now, size, quota=quota)[0]
    except QuotaRefused as exc:
        return exc.message_dict


def _validate(user, image, start, end, now=None, size=None, *, quota=True):
    """``validate``'s errors, and the image's ``vms.usable`` (read once: the claim uses it too)."""
    now = now or timezone.now()
    errors = {}
    usable = vms.usable(user, image)
    # None: not the user's to use, or no variant; which of them is read again (a refusal).
    if usable is None and user is not None and not vms.visible_images(user).filter(pk=image.pk).exists():
        return {"image": ["no such image, or you may not use it"]}, None
    if not image.active:
        errors["image"] = [f"image {image.name} is inactive"]
    elif usable is None:
        errors["image"] = [f"image {image.name} cannot be run yet: it has no variant for any hypervisor"]
    if start < now - START_GRACE:
        errors["start"] = ["the start is in the past"]
    elif start > now + timedelta(days=settings.RESERVATION_HORIZON_DAYS):
        errors["start"] = [f"at most {settings.RESERVATION_HORIZON_DAYS} days ahead"]
    if end <= start:
        errors["end"] = ["the end must be after the start"]
    if errors or not quota:
        return errors, usable
    quota = quotas.check(user, image, start, end, vms.size_for(image, **(size or {})))
    if quota:
        raise QuotaRefused(quota)
    return {}, usable


def reserve(
    user, image, *, actor, start=None, end=None, duration=None, ssh_key="", request_key="", now=None, size=None
):
    """Accept a reservation and claim its capacity; returns it. ``ValidationError`` if refused.

    ``start`` None: now. ``end`` or ``duration`` (a timedelta). ``request_key``: the form's one-time
    key; submitting it again returns the first reservation instead of making a second.
    """
    actor = Actor.of(actor)
    now = now or timezone.now()
    if request_key:
        existing = Reservation.objects.filter(user=user, request_key=request_key).first()
        if existing is not None:
            return existing
    start = start or now
    if end is None:
        if duration is None:
            raise ValidationError({"end": ["give an end or a duration"]})
        end = start + duration
    # The quotas are counted once, under their locks (check_locked), not also before them.
    errors, usable = _validate(user, image, start, end, now, size, quota=False)
    if errors:
        raise ValidationError(errors)
    start = max(start, now)  # within the grace period: "now" (capacity is claimed from now)
    try:
        # One transaction: the claim, the reservation and (when it starts now) its VM and build
        # jobs commit together; a crash leaves either all of it or nothing. Its change-log rows,
        # events and job log lines go in at its end, one INSERT per table.
        with transaction.atomic(), transitions.batched():
            try:
                quotas.check_locked(user, image, start, end, vms.size_for(image, **(size or {})))
            except ValidationError as exc:
                raise QuotaRefused(exc.message_dict) from None
            starts_now = start - timedelta(minutes=settings.RESERVATION_LEAD_MINUTES) <= now
            unsaved = _Unsaved()
            reservation = _create(
                user,
                image,
                start,
                end,
                ssh_key,
                request_key,
                size or {},
                actor=actor,
                rank=_rank(start, now),
                unsaved=unsaved,
                usable=usable,
            )
            if starts_now:  # the claim's host is known: so is the variant it runs
                variant = usable.variant_on(getattr(reservation.allocation, "host_type", None))
                provision(reservation, actor=actor, savepoint=False, unsaved=unsaved, variant=variant)
            unsaved.write(reservation)
    except NoRoom as exc:
        _refused(user, image, exc.reasons, now)
        raise
    except QuotaRefused as exc:
        _refused(user, image, {QUOTA: 1}, now)
        raise ValidationError(exc.message_dict) from None
    except IntegrityError:  # the same form, submitted twice at once: the other one won
        existing = Reservation.objects.filter(user=user, request_key=request_key).first()
        if request_key and existing is not None:
            return existing
        raise
    return reservation


def _rank(start, now=None):
    """The priority class a reservation claims with: ``RESERVATION_PRIORITY`` when it starts now
    (it may suspend runs of a lower class to make room), none for later (nothing is suspended
    ahead of time: runs end, and a later one is placed where there is room then)."""
    if start - timedelta(minutes=settings.RESERVATION_LEAD_MINUTES) > (now or timezone.now()):
        return None
    return preemption.rank(settings.RESERVATION_PRIORITY)


class NoRoom(ValidationError):
    """A refusal for want of capacity; ``reasons``: hosts refused per reason code."""

    def __init__(self, message, reasons):
        super().__init__(message)
        self.reasons = reasons


# Refusals that are not for want of capacity, as the usage report counts them.
QUOTA, SEATS = "quota", "seats_taken"


def _refused(user, image, reasons, now, group=None):
    """Count the refusal for the usage report (outside the rolled-back reservation)."""
    Refusal.objects.create(
        at=now,
        user=user,
        image=image.name,
        group=usage.group_of_user(user) if group is None else group,
        reason=usage.top_reason(reasons),
        reasons=reasons,
    )


class _Unsaved:
    """The writes to a reservation just inserted in the caller's transaction, kept until its
    acceptance is done (``write``): its changed fields in one UPDATE and its history rows in
    one INSERT, instead of one of each per status it passes through (pending, provisioning).
    Its events are emitted as the statuses change (the transaction's batch writes them)."""

    def __init__(self):
        self.fields, self.history = set(), []

    def change(self, reservation, **values):
        for name, value in values.items():
            setattr(reservation, name, value)
        self.fields.update(values)

    def write(self, reservation):
        if self.fields:
            reservation.save(update_fields=sorted(self.fields))
        if self.history:
            ReservationHistory.objects.bulk_create(self.history)
        self.fields, self.history = set(), []


def _create(
    user,
    image,
    start,
    end,
    ssh_key,
    request_key,
    size,
    block=None,
    occurrence=0,
    *,
    actor,
    rank=None,
    unsaved=None,
    usable=None,
):
    """``unsaved``: an ``_Unsaved`` keeping its writes after the INSERT (the caller writes them);
    ``usable``: the image's ``vms.usable`` as the caller read it (else it is read here)."""
    size = vms.size_for(image, **size)
    reservation = Reservation.objects.create(
        user=user,
        image=image,
        start=start,
        end=end,
        ssh_key=ssh_key.strip(),
        request_key=request_key,
        block=block,
        occurrence=occurrence,
        **size,
    )
    try:
        demand = vms.demand_for(
            image, size, start=start, end=end, purpose=f"reservation {reservation.pk}", usable=usable
        )
        allocation = capacity.claim(replace(demand, rank=rank), actor=actor, owner=user)
    except capacity.NoCapacity as exc:
        raise NoRoom({"start": [_no_capacity_message(exc.result, start)]}, dict(exc.result.reasons)) from None
    except capacity.TryAgain as exc:
        raise NoRoom({"start": [str(exc)]}, {"try_again": 1}) from None
    pending = _Unsaved() if unsaved is None else unsaved
    pending.change(reservation, allocation=allocation, status=S.PENDING)
    changelog.record(reservation, "create", actor, reason="reserved")
    woken = f" ({allocation.placement_note})" if getattr(allocation, "placement_note", "") else ""
    window = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
    host = getattr(allocation, "host_name", None) or allocation.host.name  # (as the claim checked it)
    _history(reservation, f"reserved on {host}{woken}, {window}", pending)
    if unsaved is None:
        pending.write(reservation)
    return reservation


def _history(reservation, reason, unsaved=None):
    """A history row (kept in ``unsaved`` when given, else written now) and its event."""
    row = ReservationHistory(reservation=reservation, status=reservation.status, reason=reason[:500])
    if unsaved is None:
        row.save(force_insert=True)
    else:
        unsaved.history.append(row)
    _emit(reservation, reason)


def _emit(reservation, reason=""):
    data = {
        "id": reservation.pk,
        "status": reservation.status,
        "image": reservation.image_id,
        "start": reservation.start.isoformat(),
        "end": reservation.end.isoformat(),
        "vm": reservation.vm_id,
        "reason": reason,
        "error": reservation.error,
        "degraded": reservation.degraded,
    }
    targets = [f"reservation.{reservation.pk}", "admin"]
    if reservation.user_id:
        targets.append(topics.user_topic(reservation.user_id))
    events.emit("reservation.changed", data, targets)


def _move(reservation, old, new, reason, *, savepoint=True, **values):
    """Change status ``old`` → ``new`` if it still is ``old`` (a conditional UPDATE: two
    schedulers or a user and the scheduler never both act). Returns the row or None.

    ``reservation``: an id (the row is read back after the UPDATE), or a row the caller has
    just read or written in its transaction, which is brought up to date in memory instead.
    """
    olds = old if isinstance(old, (tuple, list)) else (old,)
    known = isinstance(reservation, Reservation)
    reservation_id = reservation.pk if known else reservation
    now = timezone.now()
    with transaction.atomic(savepoint=savepoint):
        updated = Reservation.objects.filter(pk=reservation_id, status__in=olds).update(
            status=new, updated=now, **values
        )
        if not updated:
            return None
        if known:
            for name, value in {"status": new, "updated": now, **values}.items():
                setattr(reservation, name, value)
        else:
            reservation = Reservation.objects.select_related("image").get(pk=reservation_id)
        _history(reservation, reason)
    return reservation


# --- the lifecycle ----------------------------------------------------------------------


def provision(reservation, reason="building the VM", *, actor, savepoint=True, unsaved=None, variant=None):
    """Build the reservation's VM on its claim (a ``vm.create`` job; its last step settles the
    reservation, ``settle_built``; a build that ends otherwise queues ``reservation.settle``
    as it ends, ``settle_unbuilt``). A parked VM reused instead (``vm.reuse``) is followed by a
    ``reservation.settle`` job waiting for it.

    ``reservation``: an id, or the row as just written in the caller's transaction (``reserve``;
    it is kept up to date in memory). ``savepoint`` False: the caller's transaction is all or
    nothing anyway, so no savepoint of its own. ``unsaved``: the row was inserted in the
    caller's transaction, which writes what is kept there (``_Unsaved``) after this returns:
    its status change, VM and history go there too (no conditional UPDATE: the row is the
    caller's own, not yet visible to anyone). ``variant``: the id of the image's variant for
    the claim's host, when the caller knows it (the VM is recorded with it).
    """
    with transaction.atomic(savepoint=savepoint):
        # The guest is given the login at its first boot, so it is made before the VM (once: a
        # retry keeps it); it is written with the status change.
        known = reservation if isinstance(reservation, Reservation) else None
        login = _login(known) if known is not None else {}
        if unsaved is not None:
            unsaved.change(known, status=S.PROVISIONING, updated=timezone.now(), **login)
            _history(known, reason, unsaved)
        else:
            reservation = _move(reservation, (S.PENDING, S.PLACING), S.PROVISIONING, reason, savepoint=False, **login)
        if reservation is None:
            return None
        if known is None:
            login = _login(reservation)
            Reservation.objects.filter(pk=reservation.pk).update(**login)
            for name, value in login.items():
                setattr(reservation, name, value)
        reservation.attempts += 1
        size = {"vcpus": reservation.vcpus, "memory_mib": reservation.memory_mib, "disk_gib": reservation.disk_gib}
        common = {
            "actor": actor,
            "owner": reservation.user,
            "image": reservation.image,
            "name": f"res-{reservation.pk}",
            "end": reservation.end,
            "allocation": reservation.allocation,
            "reason": f"reservation {reservation.pk}",
        }
        # Its claim suspended runs to make room (``reserve``): the build waits for their jobs' end.
        waits = [(pk, []) for pk in getattr(reservation.allocation, "preempt_jobs", ())]
        # The VM is set on the reservation before the reused one reads its login from it (on commit).
        reused = vms.reuse_parked(size=size, **common, depends=waits) if reservation.image.revert_on_end else None
        vm, job = reused or vms.request_vm(
            **size, **common, checked=known is not None, savepoint=False, depends=waits, variant=variant
        )
        if unsaved is not None:
            unsaved.change(reservation, vm=vm, attempts=reservation.attempts)
        else:
            reservation.vm = vm
            reservation.save(update_fields=["vm", "attempts"])
        if reused:
            jobs.submit(
                SETTLE,
                {"reservation": reservation.pk},
                actor=actor,
                submitter=reservation.user,
                reason=f"reservation {reservation.pk}: when {vm.key} is built",
                depends=[(job, [])],
                savepoint=False,
            )
    return job


def settle(reservation_id, *, actor):
    """After a ``vm.create`` ended: ready, retry on another host, or failed. Idempotent."""
    return _settle(Reservation.objects.select_related("vm", "vm__host", "image").get(pk=reservation_id), actor=actor)


BUILDING = (VM.State.STAGING, VM.State.DEFINING, VM.State.STARTING)


def _settle(reservation, *, actor):
    """``settle`` of the row as read (with its VM, the VM's host and its image)."""
    vm = reservation.vm
    if reservation.status != S.PROVISIONING or vm is None:
        return {"status": reservation.status, "note": "nothing to settle"}
    if vm.state == VM.State.RUNNING:
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
    if vm.state in VM.LIVE and vm.state != VM.State.ERROR:  # still building (a settle run early): wait
        return {"status": reservation.status, "vm": vm.state}
    failed = [*reservation.failed_hosts, *([vm.host_id] if vm.host_id else [])]
    why = vm.error or f"the VM ended {vm.state}"
    if reservation.attempts >= MAX_ATTEMPTS or reservation.end <= timezone.now():
        _move(reservation.pk, S.PROVISIONING, S.FAILED, f"failed: {why}", error=why[:4000], failed_hosts=failed)
        _release(reservation, "reservation failed", actor=actor)
        return {"status": S.FAILED, "error": why}
    return _retry_elsewhere(reservation, failed, why, actor=actor)


SETTLE = "reservation.settle"


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
    queued = Job.objects.filter(opcode=SETTLE, status__in=Job.PENDING, params__reservation=reservation.pk)
    if queued.exists():  # (a continued build's child and parent both end: once is enough)
        return
    jobs.submit(
        SETTLE,
        {"reservation": reservation.pk},
        actor=Actor(name=f"job {job.id}"),
        submitter=reservation.user,
        reason=f"reservation {reservation.pk}: its build, job {job.id}, ended {job.status}",
        savepoint=False,
    )


def _retry_elsewhere(reservation, failed_hosts, why, *, actor):
    """Claim again, avoiding the hosts that failed, and build again (once)."""
    if (
        _move(reservation.pk, S.PROVISIONING, S.PLACING, f"retrying on another host: {why}", failed_hosts=failed_hosts)
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
    )
    try:
        with transaction.atomic():
            allocation = capacity.claim(demand, actor=actor, owner=reservation.user)
            Reservation.objects.filter(pk=reservation.pk).update(allocation=allocation)
    except (capacity.NoCapacity, capacity.TryAgain) as exc:
        text = _plain(exc.result) if isinstance(exc, capacity.NoCapacity) else str(exc)
        error = f"{why}; no other host for a retry: {text}"
        _move(reservation.pk, S.PLACING, S.FAILED, f"failed: {error}", error=error[:4000])
        return {"status": S.FAILED, "error": error}
    provision(reservation.pk, f"retrying on {allocation.host.name} after: {why}", actor=actor)
    return {"status": S.PROVISIONING, "retry": True, "host": allocation.host_id}


def _ready(reservation, vm, *, actor):
    _move(
        reservation,
        S.PROVISIONING,
        S.READY,
        f"ready on {vm.host.name if vm.host else '?'} at {vm.address or 'an unknown address'}",
        savepoint=False,  # in the settle step's transaction, which catches nothing
        **_login(reservation),
        **idle.arm(reservation, timezone.now()),
        error="",
    )
    return {"status": S.READY, "vm": vm.pk, "address": vm.address}


def _login(reservation):
    """The login fields the reservation lacks: its user name (POSIX, or Windows for an RDP
    image), and a one-time password when it has no SSH key or logs in over RDP, which needs
    one (kept encrypted; a Linux VM's seed carries only its hash, a Windows one the password)."""
    values = {}
    flavour = vms.guest_flavour(reservation.image)
    if not reservation.connect_user:
        user = reservation.user.get_username() if reservation.user else "vcl"
        values["connect_user"] = cloudinit.login_name(user, flavour=flavour)
    rdp = flavour == cloudinit.CLOUDBASE_INIT
    if (rdp or not reservation.ssh_key) and not reservation.connect_secret:
        probe = Reservation(connect_secret="")
        probe.set_password(_one_time_password())
        values["connect_secret"] = probe.connect_secret
    return values


def _one_time_password():
    # Windows' default password policy wants three of upper case, lower case, digits and
    # symbols; a random token can lack them, and cloudbase-init would then fail to set it.
    while True:
        candidate = secrets.token_urlsafe(12)
        if (
            any(c.isupper() for c in candidate)
            and any(c.islower() for c in candidate)
            and any(c.isdigit() for c in candidate)
        ):
            return candidate


def held_claims():
    """The claims reservations hold, as a Q on Allocation (verify: a claim nobody holds is an orphan)."""
    return Q(reservations__status__in=Reservation.ACTIVE)


def _release(reservation, reason, *, actor):
    """Give back the reservation's claim, and its VM's if that is another (a migrated VM claimed
    on its new host): a VM left defined (reverted) must hold no claim it could run on. A VM
    in ``error`` may still be on its host: its claims stay for verify/repair; a parked VM's
    claim of its disk stays with it (``vms.park``)."""
    held = {reservation.allocation_id}
    kept = set()  # a VM whose removal failed (error) keeps its claims until a destroy succeeds
    if reservation.vm_id:
        vm = VM.objects.filter(pk=reservation.vm_id).values("allocation_id", "target_allocation_id", "state").first()
        if vm is not None:
            held.add(vm["allocation_id"])
            if vm["state"] == VM.State.ERROR:
                kept = {vm["allocation_id"], vm["target_allocation_id"]}
    for allocation in Allocation.objects.filter(pk__in=held - kept - {None}):
        if not vms.is_parked_claim(allocation):
            capacity.release(allocation, actor=actor, reason=reason)


def end(reservation, reason="ended by the user", *, actor):
    """End a reservation now (or at its end time, from the tick): tear its VM down or revert it.

    A future one that has not started is canceled instead; a final one is left as it is.
    """
    actor = Actor.of(actor)
    if reservation.status in Reservation.FINAL or reservation.status == S.ENDING:
        raise Conflict(f"reservation {reservation.pk} is already {reservation.status}")
    if reservation.status in (S.REQUESTED, S.PENDING):
        return cancel(reservation, reason, actor=actor)
    # One transaction: "ending" with no teardown queued would be a reservation nothing ends.
    with transaction.atomic():
        moved = _move(reservation.pk, Reservation.ACTIVE, S.ENDING, reason, savepoint=False)
        if moved is None:
            raise Conflict(f"reservation {reservation.pk} changed meanwhile; reload")
        vm = moved.vm
        if vm is None or vm.state not in VM.LIVE:
            _finish(moved, "nothing to tear down", actor=actor)
            return None
        if moved.image.revert_on_end and vms.has_clean_snapshot(vm) and vm.state in VM.BUILT:
            # The system's job: it ends with the VM owned by no one (a re-run must not be refused).
            job = jobs.submit("vm.park", {"vm": vm.pk}, actor=actor, reason=f"reservation {moved.pk} ended")
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


def finish(reservation_id, *, actor):
    """After the teardown job: ended, capacity released. Idempotent."""
    reservation = Reservation.objects.select_related("vm", "allocation").get(pk=reservation_id)
    if reservation.status != S.ENDING:
        return {"status": reservation.status}
    vm = reservation.vm
    note = "VM destroyed" if vm is None or vm.state == VM.State.DESTROYED else f"VM {vm.state}"
    if vm is not None and vm.state == VM.State.STOPPED and reservation.image.revert_on_end:
        note = "VM reverted to its clean state and stopped"
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
    return vm.state not in (VM.State.DESTROYED, VM.State.FAILED, VM.State.REQUESTED, VM.State.STOPPED)


def _finish(reservation, note, *, actor):
    done = _move(reservation.pk, S.ENDING, S.ENDED, f"ended: {note}", connect_secret="")
    if done is not None:
        _release(done, "reservation ended", actor=actor)


def cancel(reservation, reason="canceled by the user", *, actor):
    """Cancel a reservation that has not started building; its capacity is given back."""
    actor = Actor.of(actor)
    with transaction.atomic():
        done = _move(reservation.pk, (S.REQUESTED, S.PENDING), S.CANCELED, reason)
        if done is None:
            raise Conflict(
                f"reservation {reservation.pk} is {reservation.status}: only one that has not started can be "
                "canceled; end it instead"
            )
        _release(done, "reservation canceled", actor=actor)
    return done


def extend(reservation, new_end, *, actor):
    """Move the end later if the host still has room then; ``ValidationError`` saying why not."""
    actor = Actor.of(actor)
    if reservation.status not in Reservation.ACTIVE or reservation.allocation_id is None:
        raise Conflict(f"reservation {reservation.pk} is {reservation.status}: it cannot be extended")
    if new_end <= reservation.end:
        raise ValidationError({"end": ["the new end must be later than the current one"]})
    allocation = reservation.allocation
    size = {"vcpus": reservation.vcpus, "memory_mib": reservation.memory_mib}
    with transaction.atomic():
        # The new window is a new holding: counted against every limit (the reservation's own
        # old window aside) under the same locks as ``reserve``, in this transaction.
        quotas.check_locked(
            reservation.user,
            reservation.image,
            reservation.start,
            new_end,
            size,
            exclude=("reservation", reservation.pk),
        )
        try:
            fresh = capacity.extend(allocation, new_end, actor=actor)
        except capacity.NoCapacity as exc:
            raise ValidationError(
                {"end": [f"cannot extend to {new_end:%Y-%m-%d %H:%M} UTC: {_plain(exc.result)} on this VM's host"]}
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
        _history(reservation, f"extended to {new_end:%Y-%m-%d %H:%M} UTC")
    return reservation


# --- claims that move ----------------------------------------------------------------------

NOT_BUILT = (S.REQUESTED, S.PENDING)


def follow_claim(old, new, *, actor):
    """A claim moved (a migration, a build re-placed off a host that left service): the
    reservation holding it points at the one that counts now (registered in ``capacity.ON_MOVED``)."""
    Reservation.objects.filter(allocation_id=old.pk).update(allocation=new, degraded="", updated=timezone.now())


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
            _history(reservation, f"safe again: {hv.name} is back online")
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


# --- a host that died: its reservations' VMs rebuilt elsewhere (Ganeti's harep) ---------------

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
        if reservation.end <= timezone.now():
            return _lost(reservation, f"{why}; its time is over", host)
        try:
            with transaction.atomic():
                return _rebuild(reservation, host, why, actor=actor)
        except (capacity.NoCapacity, capacity.TryAgain, ValidationError) as exc:
            if isinstance(exc, capacity.NoCapacity):
                text = _plain(exc.result)
            else:
                text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
            return _lost(reservation, f"{why}; it could not be rebuilt elsewhere: {text}", host)


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
    )
    allocation = capacity.claim(demand, actor=actor, owner=reservation.user)
    moved = _move(
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
    provision(moved.pk, f"rebuilding from image {moved.image.name} on {allocation.host.name}", actor=actor)
    return {"reservation": moved.pk, "rebuilt": True, "host": allocation.host_id}


def _lost(reservation, why, host):
    why = why[:500]
    moved = _move(reservation.pk, BUILDING_OR_READY, S.FAILED, f"failed: {why}", error=why, connect_secret="")
    _host_lost_event(moved or reservation, host, why, "failed")
    return {"reservation": reservation.pk, "failed": True, "reason": why}


def _host_lost_event(reservation, host, why, outcome):
    """For others to hook (e-mail): the reservation's VM was lost with its host; ``outcome``
    says what happens now (``rebuilding`` or ``failed``)."""
    targets = [f"reservation.{reservation.pk}", "admin"]
    if reservation.user_id:
        targets.append(topics.user_topic(reservation.user_id))
    events.emit(
        "reservation.host_lost",
        {"id": reservation.pk, "host": host.name, "outcome": outcome, "reason": why, "user": reservation.user_id},
        targets,
    )


def vm_gone(vm, reason, *, actor):
    """A VM found gone from its host (verify's repair; registered in ``repair.ON_GONE``):
    its reservation ends with the reason (its claims were released with the VM)."""
    for reservation in Reservation.objects.filter(vm=vm, status__in=(*Reservation.ACTIVE, S.ENDING)):
        done = _move(
            reservation.pk,
            (*Reservation.ACTIVE, S.ENDING),
            S.ENDED,
            f"ended: {reason}",
            error=reason[:4000],
            connect_secret="",
        )
        if done is not None:
            _release(done, f"reservation ended: {reason}"[:500], actor=actor)
            changelog.record(done, "update", actor, {"status": [reservation.status, S.ENDED]}, reason[:500])


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
        size = {"vcpus": reservation.vcpus, "memory_mib": reservation.memory_mib, "disk_gib": reservation.disk_gib}
        demand = vms.demand_for(
            reservation.image,
            size,
            start=reservation.start,
            end=reservation.end,
            purpose=f"reservation {reservation.pk}",
            exclude_hosts=[host_id],
        )
        why = f"{host.name} is {host.state} ({host.state_reason})"
        try:
            fresh = capacity.replace_claim(allocation, demand, actor=actor, reason=f"reservation {reservation.pk}")
        except (capacity.NoCapacity, capacity.TryAgain) as exc:
            text = _plain(exc.result) if isinstance(exc, capacity.NoCapacity) else str(exc)
            return _degrade(reservation, f"{why}; tried every other host: {text}")
        reservation.refresh_from_db()
        _history(reservation, f"moved from {host.name} to {fresh.host.name}: {why}")
        events.emit(
            "reservation.moved",
            {"id": reservation.pk, "reason": why, "allocation": fresh.pk, "start": reservation.start.isoformat()},
            _targets(reservation),
        )
        changelog.record(reservation, "update", actor, {"host": [host.name, fresh.host.name]}, why)
    return {"reservation": reservation_id, "moved": True, "host": fresh.host_id}


def _degrade(reservation, why):
    """Keep the claim where it is (the host may come back before the start), and say so."""
    why = why[:500]
    Reservation.objects.filter(pk=reservation.pk).update(degraded=why, updated=timezone.now())
    reservation.degraded = why
    _history(reservation, f"endangered: {why}")
    targets = _targets(reservation)
    events.emit(
        "reservation.degraded", {"id": reservation.pk, "reason": why, "start": reservation.start.isoformat()}, targets
    )
    return {"reservation": reservation.pk, "degraded": True, "reason": why}


def _targets(reservation):
    targets = [f"reservation.{reservation.pk}", "admin"]
    if reservation.user_id:
        targets.append(topics.user_topic(reservation.user_id))
    return targets


def connection(reservation):
    """What the user needs to log in, once ready: address, user, password or key, commands."""
    vm = reservation.vm
    if reservation.status != S.READY or vm is None:
        return None
    address = vm.address or ""
    rdp = vms.login_protocol(reservation.image) == "rdp"
    port = vm.port or vms.login_port(reservation.image)
    if rdp:
        command = f"mstsc /v:{address}" + (f":{port}" if port != 3389 else "")
    else:
        command = f"ssh {'' if port == 22 else f'-p {port} '}{reservation.connect_user}@{address}"
    return {
        "address": address,
        "port": port,
        "user": reservation.connect_user,
        "password": reservation.get_password(),
        "ssh_key": bool(reservation.ssh_key),
        "protocol": "rdp" if rdp else "ssh",
        "command": command,
    }


def rdp_file(reservation):
    details = connection(reservation)
    if details is None:
        return None
    custom = details["protocol"] == "rdp" and details["port"] != 3389
    where = details["address"] + (f":{details['port']}" if custom else "")
    return f"full address:s:{where}\r\nusername:s:{details['user']}\r\nprompt for credentials:i:1\r\n"


# --- block allocations ------------------------------------------------------------------


def may_manage_blocks(user):
    """Instructors (``accounts.access``; the older ``add_blockallocation`` permission counts too)."""
    return access.can(user, "teach") or user.has_perm("reservations.add_blockallocation")


def managed_blocks(user):
    """The blocks ``user`` may cancel: administrators any, an instructor those of their groups."""
    blocks = BlockAllocation.objects.select_related("image", "group")
    if access.is_admin(user):
        return blocks
    return blocks.filter(group__in=teaching_groups(user)) if may_manage_blocks(user) else blocks.none()


def teaching_groups(user):
    """``access.teaching_groups``, for the older permission too: never a role group."""
    if access.is_admin(user):
        return Group.objects.all()
    return access.own_groups(user) if may_manage_blocks(user) else Group.objects.none()


def create_block(*, actor, name, image, group, seats, start, end, weeks=1, created_by=None, now=None):
    """Reserve ``seats`` of ``image`` for ``group`` each week; all occurrences claimed at once or none."""
    actor = Actor.of(actor)
    now = now or timezone.now()
    errors = {}
    if not name.strip():
        errors["name"] = ["give the block a name"]
    if not isinstance(group, Group):
        errors["group"] = ["no such group"]
    if not (1 <= int(seats) <= 1000):
        errors["seats"] = ["between 1 and 1000 seats"]
    if not (1 <= int(weeks) <= 52):
        errors["weeks"] = ["between 1 and 52 weeks"]
    errors.update({k: v for k, v in validate(None, image, start, end, now).items() if k not in errors})
    if errors:
        raise ValidationError(errors)
    if created_by is not None and not teaching_groups(created_by).filter(pk=group.pk).exists():
        log.warning("block for group %s refused to %s: not one of their groups", group.name, created_by)
        raise PermissionDenied(f"you may only make blocks for your own groups, not {group.name}")
    members = list(group.user_set.filter(is_active=True).order_by("username")) if isinstance(group, Group) else []
    with transaction.atomic():
        block = BlockAllocation.objects.create(
            name=name.strip(),
            image=image,
            group=group,
            seats=seats,
            start=start,
            end=end,
            weeks=weeks,
            created_by=created_by,
        )
        for week in range(int(weeks)):
            shift = timedelta(weeks=week)
            for seat in range(int(seats)):
                user = members[seat] if seat < len(members) else None
                try:
                    if image.max_concurrent is not None:  # seats are the instructor's: only the licence cap binds
                        quotas.check_locked(None, image, start + shift, end + shift, vms.size_for(image))
                    _create(user, image, start + shift, end + shift, "", "", {}, block, week, actor=actor)
                except ValidationError as exc:  # all or nothing: roll every claim back
                    detail = "; ".join(exc.message_dict.get("start", exc.messages))
                    raise ValidationError(
                        {"seats": [f"week {week + 1}, seat {seat + 1} of {seats} does not fit: {detail}"]}
                    ) from None
        changelog.record(block, "create", actor, reason=f"{seats} seats × {weeks} weeks for {group.name}")
    due = start - timedelta(minutes=settings.RESERVATION_LEAD_MINUTES) <= now
    if due:
        for seat_id in block.seat_reservations.filter(occurrence=0).values_list("pk", flat=True):
            provision(seat_id, "pre-provisioning a class seat", actor=actor)
    return block


def take_seat(user, block, now=None, *, actor):
    """A member of the block's group takes a free seat of the current or next occurrence."""
    now = now or timezone.now()
    if block.canceled or not user.groups.filter(pk=block.group_id).exists():
        raise ValidationError({"block": ["you are not in this class's group"]})
    upcoming = block.seat_reservations.filter(status__in=Reservation.ACTIVE, end__gt=now).order_by("start", "pk")
    held = upcoming.filter(user=user).first()
    if held is not None:
        return held
    for seat in upcoming.filter(user__isnull=True):
        with transaction.atomic():
            if Reservation.objects.filter(pk=seat.pk, user__isnull=True).update(user=user):
                if seat.vm_id:
                    VM.objects.filter(pk=seat.vm_id).update(owner=user)
                seat.refresh_from_db()
                _history(seat, f"seat taken by {user.get_username()}")
                return seat
    _refused(user, block.image, {SEATS: 1}, now, group=block.group.name)
    raise ValidationError({"block": ["every seat is taken"]})


def block_usage(block, now=None):
    now = now or timezone.now()
    current = (
        block.seat_reservations.filter(end__gt=now).order_by("occurrence").values_list("occurrence", flat=True).first()
    )
    seats = block.seat_reservations.filter(occurrence=current if current is not None else block.weeks - 1)
    return {
        "occurrence": (current or 0) + 1,
        "seats": block.seats,
        "taken": seats.filter(user__isnull=False).count(),
        "ready": seats.filter(status=S.READY).count(),
        "failed": seats.filter(status=S.FAILED).count(),
    }


def cancel_block(block, reason="block canceled", *, actor):
    actor = Actor.of(actor)
    BlockAllocation.objects.filter(pk=block.pk).update(canceled=True)
    for seat in block.seat_reservations.filter(status__in=Reservation.ACTIVE):
        try:
            end(seat, reason, actor=actor)
        except Conflict:
            pass


# --- the scheduler ----------------------------------------------------------------------


def tick(now=None, *, actor=None):
    """Start what is due, end what is over, warn what ends soon. Safe to run anywhere, any time."""
    now = now or timezone.now()
    actor = actor or Actor(name="scheduler")
    lead = timedelta(minutes=settings.RESERVATION_LEAD_MINUTES)
    done = {"started": 0, "ended": 0, "warned": 0, "expired": 0}
    for rid in Reservation.objects.filter(status=S.PENDING, start__lte=now + lead, end__gt=now).values_list(
        "pk", flat=True
    ):
        if provision(rid, "its start is near: building the VM", actor=actor):
            done["started"] += 1
    for reservation in Reservation.objects.filter(status__in=Reservation.ACTIVE, end__lte=now).select_related("vm"):
        try:
            end(reservation, "its time is over", actor=actor)
            done["ended" if reservation.status != S.PENDING else "expired"] += 1
        except Conflict:
            pass
    warn_at = now + timedelta(minutes=settings.RESERVATION_WARN_MINUTES)
    for reservation in Reservation.objects.filter(status=S.READY, warned=False, end__lte=warn_at, end__gt=now):
        with transaction.atomic():
            if Reservation.objects.filter(pk=reservation.pk, warned=False).update(warned=True):
                minutes = max(1, round((reservation.end - now).total_seconds() / 60))
                targets = [f"reservation.{reservation.pk}", topics.user_topic(reservation.user_id)]
                events.emit(
                    "reservation.ending",
                    {"id": reservation.pk, "minutes": minutes, "end": reservation.end.isoformat()},
                    targets,
                )
                done["warned"] += 1
    done["refinished"] = _finish_stalled_endings(now, actor=actor)
    # A host scheduled to leave service "after its reservations" goes once the last has ended.
    left = capacity.apply_scheduled(now, actor=actor)
    if left:
        done["hosts_left_service"] = left
    return done


STALLED_ENDING = timedelta(minutes=10)


def _finish_stalled_endings(now, *, actor):
    """Queue ``reservation.finish`` again for a reservation still ending a while after its
    last job (an admin canceled its finish job, or it failed): idempotent, it settles it.
    Returns how many."""
    from jobs.models import Job

    stalled = Reservation.objects.filter(status=S.ENDING, updated__lte=now - STALLED_ENDING)
    vms_of = dict(stalled.values_list("pk", "vm_id")[:100])  # every tick: usually none
    ids = list(vms_of)
    if not ids:
        return 0
    # Not while one of its jobs or its VM's is unfinished (a slow teardown), nor again soon after
    # one of its own (a finish that keeps failing is tried once every STALLED_ENDING).
    mine = Job.objects.filter(params__reservation__in=ids)
    busy = mine.exclude(status__in=Job.FINAL) | mine.filter(received__gt=now - STALLED_ENDING)
    busy_ids = set(busy.values_list("params__reservation", flat=True))
    tearing = Job.objects.filter(params__vm__in=[v for v in vms_of.values() if v]).exclude(status__in=Job.FINAL)
    busy_vms = set(tearing.values_list("params__vm", flat=True))
    busy_ids |= {rid for rid, vm_id in vms_of.items() if vm_id in busy_vms}
    for rid in ids:
        if rid not in busy_ids:
            jobs.submit(
                "reservation.finish",
                {"reservation": rid},
                actor=actor,
                reason=f"reservation {rid}: still ending {STALLED_ENDING} after its teardown",
            )
    return len(set(ids) - busy_ids)


def build_job(reservation):
    """The job building the reservation's current VM (None before building starts)."""
    from jobs.models import Job

    if not reservation.vm_id:
        return None
    return Job.objects.filter(opcode="vm.create", params__vm=reservation.vm_id).order_by("-id").first()
