"""Accepting a reservation: the request checked (``validate``, ``check_fit``), the quotas counted
under their locks, the capacity claimed for the whole window in the transaction that creates
the row (``reserve``, ``create``), a refusal counted for the usage report (``refused``), and the
build of its VM started on that claim (``provision``). Also the quota engine's holder for
reservations (``holdings``), and the hours budgets a layer above sets (``BUDGETS``: a class's
hours outside its sessions), counted beside the quotas under the same locks."""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from capacity import preemption
from capacity import services as capacity
from core import changelog
from core.changelog import Actor
from core.hooks import Hook
from inventory.devices import MODEL_RE
from jobs import services as jobs
from jobs import transitions
from placement import refusals as placement_reasons
from provisioning import private_networks, quotas, warm
from provisioning import services as vms
from reservations import logins, status, usage
from reservations.models import MAX_GPUS, Refusal, Reservation

S = Reservation.Status
START_GRACE = timedelta(minutes=2)  # a form filled in at 10:00 and sent at 10:01 still means "now"


def holdings(window):
    """The quota engine's holder for reservations (registered at start-up): each active one
    overlapping the window, as ``(vcpus, memory_mib)``; an environment's machines as one, their
    sizes added up (but each machine on its own for a limit of its image: a licence counts
    copies). An image's template is its maintainers' work on the image, not a user's seat:
    never counted (``templates``)."""
    rows = Reservation.objects.filter(status__in=Reservation.ACTIVE, end__gt=window.start, template_of__isnull=True)
    if window.end is not None:  # None: open-ended (a staff VM's), every later one overlaps
        rows = rows.filter(start__lt=window.end)
    rows = window.narrow(rows, "reservation")
    if window.exclude is not None and window.exclude[0] == "environment":  # being extended: counted anew
        rows = rows.exclude(Q(pk=window.exclude[1]) | Q(head_id=window.exclude[1]))
    if window.image_id is None:  # an environment is one reservation, of its machines' sizes added up
        units = rows.order_by().values(unit=Coalesce("head_id", "pk"))
        return units.annotate(vcpus_all=Sum("vcpus"), memory_all=Sum("memory_mib")).values_list(
            "vcpus_all", "memory_all"
        )
    return rows.values_list("vcpus", "memory_mib")  # a limit of one image (a licence cap): each copy of it


@dataclass(frozen=True)
class Budget:
    """An hours budget that applies to one request: where it stands, and why it is refused."""

    note: str  # "12.5 hours left of your 20-hour budget for Networks lab"
    refusal: str = ""  # blank: the request fits in it


# ``budget(user, image, start, end, *, exclude=None)`` -> ``Budget`` or None (none applies).
# ``end`` None: only where it stands; ``exclude``: ``("reservation", pk)`` being extended (its
# hours counted with the new end). Filled by the classes app (a class's hours outside sessions).
BUDGETS: Hook[Callable[..., Budget | None]] = Hook("reservations.reserving.BUDGETS")


def budget_errors(user, image, start, end, *, exclude=None):
    """Refusals of the hours budgets (``{"end": [message]}``; empty: within them). Counted under
    the quota locks when the caller holds them (``check_locked`` locked the user's row first), so
    one user's parallel requests are counted one after the other."""
    if user is None:
        return {}
    found = [budget(user, image, start, end, exclude=exclude) for budget in BUDGETS]
    refusals = [b.refusal for b in found if b is not None and b.refusal]
    return {"end": refusals} if refusals else {}


def budget_notes(user, image, at):
    """Where the user's hours budgets for ``image`` at ``at`` stand, in words (the reserve form)."""
    if user is None:
        return []
    return [b.note for b in (budget(user, image, at, None) for budget in BUDGETS) if b is not None]


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


def plain_refusal(result):
    """A placement refusal in words a user understands."""
    why = "; ".join(n for n in (placement_reasons.summarize(result.reasons), result.note) if n) or "no hosts"
    return f"no host has room then ({why})"


def _no_capacity_message(result, start):
    text = plain_refusal(result)
    fit = result.earliest_fit
    if fit is not None and fit.start is not None:
        # In the reader's zone (UTC in the API); minutes unless it has seconds, as format_time.
        earliest = timezone.localtime(datetime.fromtimestamp(fit.start, UTC))
        shown = earliest.strftime("%Y-%m-%d %H:%M:%S %Z" if earliest.second else "%Y-%m-%d %H:%M %Z")
        return f"{text}; the earliest start that fits is {shown}"
    return f"{text}; it does not fit at any time soon"


def check_fit(image, start, end, gpus=None, gpu_model=None, **size):
    """Would an ``image`` VM (with ``gpus`` of ``gpu_model``, None: the image's defaults) fit
    over ``[start, end)``? Writes nothing."""
    gpus, gpu_model = gpu_ask(image, gpus, gpu_model)
    demand = vms.demand_for(
        image, vms.size_for(image, **size), start=start, end=end, purpose="check", gpus=gpus, gpu_model=gpu_model
    )
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


def gpu_ask(image, gpus=None, gpu_model=None):
    """``(gpus, gpu_model)`` asked: what is given, else the image's defaults (None: not given;
    no GPUs ask for no model)."""
    gpus = image.default_gpus if gpus is None else gpus
    if gpu_model is None:
        gpu_model = image.default_gpu_model if gpus else ""
    return gpus, gpu_model


def gpu_errors(gpus, gpu_model):
    """Per-field errors of a GPU ask (empty: acceptable, capacity aside)."""
    if not 0 <= gpus <= MAX_GPUS:
        return {"gpus": [f"ask for 0 to {MAX_GPUS} GPUs"]}
    if gpu_model and not gpus:
        return {"gpu_model": ["a GPU model needs gpus of 1 or more"]}
    if gpu_model and not MODEL_RE.match(gpu_model):
        return {"gpu_model": ["a model name is letters, digits, '.', '_' or '-'"]}
    return {}


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
    for name, messages in budget_errors(user, image, max(start, now), end).items():
        quota.setdefault(name, []).extend(messages)
    if quota:
        raise QuotaRefused(quota)
    return {}, usable


def reserve(
    user,
    image,
    *,
    actor,
    start=None,
    end=None,
    duration=None,
    ssh_key="",
    request_key="",
    now=None,
    size=None,
    gpus=None,
    gpu_model=None,
    revision=None,
):
    """Accept a reservation and claim its capacity; returns it. ``ValidationError`` if refused.

    ``start`` None: now. ``end`` or ``duration`` (a timedelta). ``request_key``: the form's one-time
    key; submitting it again returns the first reservation instead of making a second.
    ``gpus``: that many GPUs of ``gpu_model`` (blank: of any one model); None: the image's
    ``default_gpus`` / ``default_gpu_model``.
    ``revision``: the image's revision its VM is built from (one under test); None: production.
    """
    actor = Actor.of(actor)
    now = now or timezone.now()
    existing = made_already(user, request_key)
    if existing is not None:
        return existing
    start, end = window(start, end, duration, now)
    # The quotas are counted once, under their locks (check_locked), not also before them.
    errors, usable = _validate(user, image, start, end, now, size, quota=False)
    gpus, gpu_model = gpu_ask(image, gpus, gpu_model)
    errors.update(gpu_errors(gpus, gpu_model))
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
                over = budget_errors(user, image, start, end)  # under check_locked's lock on the user
                if over:
                    raise ValidationError(over)
            except ValidationError as exc:
                raise QuotaRefused(exc.message_dict) from None
            starts_now = start - timedelta(minutes=settings.RESERVATION_LEAD_MINUTES) <= now
            unsaved = status.Unsaved()
            reservation = create(
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
                gpus={"gpus": gpus, "gpu_model": gpu_model},
                revision=revision,
            )
            if starts_now:  # the claim's host is known: so is the variant it runs
                # (a pinned revision's is picked by the build, from that revision's variants)
                host_type = getattr(reservation.allocation, "host_type", None)
                variant = usable.variant_on(host_type) if revision is None else None
                provision(reservation, actor=actor, savepoint=False, unsaved=unsaved, variant=variant)
            unsaved.write(reservation)
    except NoRoom as exc:
        refused(user, image, exc.reasons, now)
        raise
    except QuotaRefused as exc:
        refused(user, image, {QUOTA: 1}, now)
        raise ValidationError(exc.message_dict) from None
    except IntegrityError:  # the same form, submitted twice at once: the other one won
        existing = Reservation.objects.filter(user=user, request_key=request_key).first()
        if request_key and existing is not None:
            return existing
        raise
    return reservation


def made_already(user, request_key):
    """The reservation a form's one-time key made already (None: none yet, or no key)."""
    return Reservation.objects.filter(user=user, request_key=request_key).first() if request_key else None


def window(start, end, duration, now):
    """``(start, end)`` asked: ``start`` None is now; ``end``, or ``duration`` (a timedelta) after it."""
    start = start or now
    if end is None:
        if duration is None:
            raise ValidationError({"end": ["give an end or a duration"]})
        end = start + duration
    return start, end


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


def refused(user, image, reasons, now, group=None):
    """Count the refusal for the usage report (outside the rolled-back reservation)."""
    Refusal.objects.create(
        at=now,
        user=user,
        image=image.name,
        group=usage.group_of_user(user) if group is None else group,
        reason=usage.top_reason(reasons),
        reasons=reasons,
    )


def create(
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
    gpus=None,
    revision=None,
    template=False,
):
    """``unsaved``: a ``status.Unsaved`` keeping its writes after the INSERT (the caller writes them);
    ``usable``: the image's ``vms.usable`` as the caller read it (else it is read here);
    ``gpus``: ``{"gpus": n, "gpu_model": name}`` (``Reservation.gpu_ask``), None: none;
    ``revision``: the revision its VM is built from (None: production); ``template``: the image's
    template (``templates``)."""
    size = vms.size_for(image, **size)
    gpus = gpus or {}
    reservation = Reservation.objects.create(
        revision=revision,
        template_of=image if template else None,
        user=user,
        image=image,
        start=start,
        end=end,
        ssh_key=ssh_key.strip(),
        request_key=request_key,
        block=block,
        occurrence=occurrence,
        **size,
        **gpus,
    )
    try:
        demand = vms.demand_for(
            image,
            size,
            start=start,
            end=end,
            purpose=f"reservation {reservation.pk}",
            usable=usable,
            **reservation.gpu_ask(),
        )
        # Starting now: in a warm VM's room first (the build then takes that VM), so the claim
        # never evicts a warm VM that it could have taken instead.
        taking = rank is not None and block is None and not template and revision is None
        allocation = warm.claim(image, size, demand, actor=actor, owner=user) if taking else None
        if allocation is None:
            allocation = capacity.claim(replace(demand, rank=rank), actor=actor, owner=user)
    except capacity.NoCapacity as exc:
        raise NoRoom({"start": [_no_capacity_message(exc.result, start)]}, dict(exc.result.reasons)) from None
    except capacity.TryAgain as exc:
        raise NoRoom({"start": [str(exc)]}, {"try_again": 1}) from None
    pending = status.Unsaved() if unsaved is None else unsaved
    pending.change(reservation, allocation=allocation, status=S.PENDING)
    changelog.record(reservation, "create", actor, reason="reserved")
    woken = f" ({allocation.placement_note})" if getattr(allocation, "placement_note", "") else ""
    window = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
    host = getattr(allocation, "host_name", None) or allocation.host.name  # (as the claim checked it)
    status.history(reservation, f"reserved on {host}{woken}, {window}", pending)
    if unsaved is None:
        pending.write(reservation)
    return reservation


SETTLE = "reservation.settle"


def provision(reservation, reason="building the VM", *, actor, savepoint=True, unsaved=None, variant=None):
    """Build the reservation's VM on its claim (a ``vm.create`` job; its last step settles the
    reservation, ``settle_built``; a build that ends otherwise queues ``reservation.settle``
    as it ends, ``settle_unbuilt``). A parked VM reused instead (``vm.reuse``) is followed by a
    ``reservation.settle`` job waiting for it. A pooled image's reservation takes a warm VM
    when one is free (``provisioning.warm.take``: its ``vm.create`` hands the login over in the
    running guest, or builds it cold if that fails); one built cold is counted a miss.

    ``reservation``: an id, or the row as just written in the caller's transaction (``reserve``;
    it is kept up to date in memory). ``savepoint`` False: the caller's transaction is all or
    nothing anyway, so no savepoint of its own. ``unsaved``: the row was inserted in the
    caller's transaction, which writes what is kept there (``status.Unsaved``) after this returns:
    its status change, VM and history go there too (no conditional UPDATE: the row is the
    caller's own, not yet visible to anyone). ``variant``: the id of the image's variant for
    the claim's host, when the caller knows it (the VM is recorded with it).
    """
    with transaction.atomic(savepoint=savepoint):
        # The guest is given the login at its first boot, so it is made before the VM (once: a
        # retry keeps it); it is written with the status change.
        known = reservation if isinstance(reservation, Reservation) else None
        login = logins.fields_lacking(known) if known is not None else {}
        if unsaved is not None:
            unsaved.change(known, status=S.PROVISIONING, updated=timezone.now(), **login)
            status.history(known, reason, unsaved)
        else:
            reservation = status.move(
                reservation, (S.PENDING, S.PLACING), S.PROVISIONING, reason, savepoint=False, **login
            )
        if reservation is None:
            return None
        if known is None:
            login = logins.fields_lacking(reservation)
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
        # A parked VM is production's and a template is changed for good: neither takes one.
        # An environment's machine is built fresh: a parked VM has none of its networks.
        fresh = reservation.revision_id is not None or reservation.environment_id is not None
        reusable = reservation.image.revert_on_end and not fresh
        reused = vms.reuse_parked(size=size, **common, depends=waits) if reusable else None
        # A pooled image's VM is taken warm when one is (its claim may move to that VM's host).
        taken = None if fresh or reused else warm.take(reservation, size, actor=actor)
        if taken is not None:
            vm, reservation.allocation = taken
            job = jobs.submit(
                "vm.create",
                {"vm": vm.pk, "warm": True},
                actor=actor,
                submitter=reservation.user,
                reason=f"reservation {reservation.pk}: {vm.key} taken warm",
                savepoint=False,
                depends=waits,  # (warm VMs its claim made room by destroying, when it was made)
            )
        else:
            vm, job = reused or vms.request_vm(
                **size,
                **common,
                checked=known is not None,
                savepoint=False,
                depends=waits,
                variant=variant,
                revision=reservation.revision,
            )
            if reservation.image.warm_max and not fresh and not reused:
                warm.mark_miss(vm.pk)
        if reservation.environment_id:  # its hostname and its networks, before its build runs (on commit)
            vm.hostname = reservation.hostname
            vm.save(update_fields=["hostname"])
            key = f"env{reservation.head_id or reservation.pk}"
            vm.networks.set(private_networks.of_machine(key, vm.hostname, reservation.allocation.host_id))
        if unsaved is not None:
            unsaved.change(reservation, vm=vm, attempts=reservation.attempts, allocation=reservation.allocation)
        else:
            reservation.vm = vm
            reservation.save(update_fields=["vm", "attempts", "allocation"])
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
