"""Warm pools for reservations: VMs of an image booted ahead, with no login, for the next
reservations to take (the DRM article's VMs resumed instead of created).

- An image with ``warm_max`` above 0 keeps ``warm_min`` to ``warm_max`` warm VMs. ``fill`` (each
  worker's round every ``WARM_POOL_SECONDS``, and a once-a-minute Schedule: ``tasks``) requests
  the missing ones up to the minimum, each claimed where it fits without making room, and
  destroys those above the maximum. A warm VM is built by
  ``vm.warm`` (``opcodes/warm.py``) from the production revision with no seed, so it holds no
  one's login; booted and answering, it is snapshotted running, memory included (``warm``),
  and stays running, owned by no one (``VM.warm`` "warm"). An image whose warm VM failed within
  ``RETRY_AFTER`` is not filled again until then (a broken image must not build in a loop).
- A warm VM's claim is open-ended and yields (``Allocation.yields``): it is made only where there
  is room (nothing woken, suspended or evicted for it), and any other claim that needs its room
  takes it (``evict``, the ``capacity.ON_YIELD`` hook: the claim is released and the VM destroyed
  before the new claim's VM is built). So the pool never refuses a reservation that would have
  fitted without it.
- ``take``: a reservation of a pooled image that starts now, of the image's default size and
  without GPUs, takes a warm VM (one on its claim's host first, else one elsewhere if the claim
  fits on that host instead): the VM becomes the reservation's, on the reservation's claim, and
  its ``vm.create`` (``{"warm": true}``) hands the login over in the running guest (``VM.warm``
  "hit"). A reservation of a pooled image built cold is a "miss" (none warm to take, or the warm
  start failed and the same VM was built cold instead).
- Sizes: the pool's target is not always ``warm_min``: it is the demand of the coming hour in
  past weeks (the reservations of the image that started in the same weekday and hour of each
  of the last ``WARM_HISTORY_WEEKS``, their ``WARM_HISTORY_PERCENTILE``: ``warm_sizing``, pure,
  fed by the ``STARTS`` hook's query), kept within ``warm_min``..``warm_max``.
- Ahead of known starts (a class session's seats, through the ``AHEAD`` hook: ``classes``):
  warm VMs of the image's default size, whose yielding claims end when the seats' begin
  (``Ahead``), requested beside the pool's and beyond its maximum (any image, pooled or not).
  Each goes on the host of the seats' claims while it fits there, else where the placement core
  finds room for it and, after it, for a seat until the seats' end (the seat's claim moves there
  when it takes it), counting the seats already sent to each host as if their room were held.
  A seat's build takes one as any reservation's does (``take``: its own host's first); those
  no seat took are destroyed once no start wants them (their claims' end passed,
  the session built or canceled). They are counted per start, wherever they run.
- After use a VM taken warm is reverted to its warm snapshot (memory and disk: nothing of its
  user's is left, their login included) and goes back to the pool (``vm.rewarm``,
  ``back_to_pool``) if the pool has room for it, else it is destroyed. Its next user gets a new
  identity again when they take it: no two users share host keys or a machine-id.
"""

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Count, F, IntegerField, Q, Sum, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from capacity import preemption
from capacity import services as capacity
from core import changelog
from core.changelog import Actor
from core.hooks import Hook
from drivers.base import vm_key
from inventory.models import Hypervisor
from jobs import services as jobs
from provisioning import services, warm_sizing
from provisioning.models import VM, Image, ImageRevision

W = VM.Warm
S = VM.State
GONE = (S.DESTROYED, S.FAILED, S.LOST)
RETRY_AFTER = timedelta(minutes=5)
CANDIDATES = 5  # warm VMs tried before a reservation is built cold
ACTOR = Actor(name="warm pools")


@dataclass(frozen=True)
class Ahead:
    """Warm VMs wanted ahead of known starts: ``count`` of image ``image_id``'s default size on
    host ``host_id`` (or wherever there is room), their claims ending at ``until`` (when the
    claims of those they stand in for begin, on ``host_id``; ``end``: when those end, the room
    one of them needs on another host to move to its warm VM there; None: only on ``host_id``)."""

    image_id: int
    host_id: int
    until: datetime
    count: int
    end: datetime | None = None


# Who knows of starts to come (a class session's seats: ``classes``) registers ``ahead(now)`` ->
# ``Ahead`` rows; each round requests those warm VMs beside the pools'.
AHEAD: Hook[Callable[[datetime], Iterable[Ahead]]] = Hook("provisioning.warm.AHEAD")
# Who knows the reservations (``reservations``) registers ``starts(image_ids, windows)`` ->
# ``{image id: [how many started in each window]}``: the usage history a pool is sized from.
STARTS: Hook[Callable[..., dict]] = Hook("provisioning.warm.STARTS", single=True)


def pooled_images():
    """Active images that keep a warm pool."""
    return Image.objects.filter(warm_max__gt=0, active=True, revert_on_end=False)


def warm_vms(image):
    """The image's warm VMs: built, or being built, for its pool and not taken yet."""
    return VM.objects.filter(image=image, warm=W.WARM).exclude(state__in=GONE)


def fill_round(*, actor=ACTOR, now=None):
    """``fill`` every pooled image and every image with warm VMs wanted ahead, and empty the
    pools of images that no longer keep one (its sizes set to 0, deactivated); ``{image name:
    what was done}``."""
    now = now or timezone.now()
    ahead = wanted_ahead(now)
    pooled = list(pooled_images())
    wanted = wanted_counts(pooled, now)
    holding = VM.objects.filter(warm=W.WARM).exclude(state__in=GONE).values("image_id")
    others = Image.objects.filter(Q(pk__in=ahead) | Q(pk__in=holding)).exclude(pk__in=[i.pk for i in pooled])
    images = {image.pk: image for image in [*pooled, *others]}
    return {image.name: fill(image, actor=actor, now=now, want=wanted.get(pk, 0)) for pk, image in images.items()}


def wanted_counts(images, now=None):
    """``{image id: warm VMs wanted for the coming hour}`` of pooled ``images``: from the starts
    of the same hour in past weeks (``warm_sizing.wanted``), within each one's sizes."""
    now = now or timezone.now()
    images = [image for image in images if image.warm_max]
    windows = warm_sizing.hour_windows(now, settings.WARM_HISTORY_WEEKS)
    starts = STARTS.one()
    past = starts([image.pk for image in images], windows) if starts is not None and windows and images else {}
    q = settings.WARM_HISTORY_PERCENTILE
    return {i.pk: warm_sizing.wanted(past.get(i.pk, ()), i.warm_min, i.warm_max, q) for i in images}


def wanted_ahead(now=None):
    """``{image id: [Ahead]}``: the warm VMs every ``AHEAD`` source wants now."""
    now = now or timezone.now()
    found = defaultdict(list)
    for source in AHEAD:
        for row in source(now):
            found[row.image_id].append(row)
    return dict(found)


def fill(image, *, actor=ACTOR, now=None, want=None, ahead=None):
    """Bring the image's pool to ``want`` (default: ``wanted_counts``, which is at least
    ``warm_min``) up to ``warm_max`` warm VMs and its warm VMs ahead to ``ahead`` (default:
    ``wanted_ahead``): destroy the stale ones (of a revision no longer production, of another
    size than the image's default, on a claim that does not yield or has ended: no reservation
    would take them), those above the maximum (the newest first: the likeliest still building)
    and those ahead no longer wanted; request the missing ones where they fit without making
    room. Counted under the image's row lock, so two rounds at once never build more."""
    now = now or timezone.now()
    if want is None:
        want = wanted_counts([image], now).get(image.pk, 0)
    with transaction.atomic():
        image = Image.objects.select_for_update().get(pk=image.pk)
        if ahead is None:  # read under the lock, just before the VMs: a seat may take one meanwhile
            ahead = wanted_ahead(now).get(image.pk, ())
        pooled = pooled_images().filter(pk=image.pk).exists()
        low, high = (min(max(want, image.warm_min), image.warm_max), image.warm_max) if pooled else (0, 0)
        have = warm_vms(image).order_by("-pk")
        fresh = Q(revision__isnull=True) | Q(revision__state=ImageRevision.State.PRODUCTION)
        # (a claim that no longer yields: the VM was moved, by an evacuation say, on an ordinary one)
        fresh &= Q(allocation__yields=True, allocation__released__isnull=True)
        fresh &= Q(allocation__end__isnull=True) | Q(allocation__end__gt=now)
        stale = list(have.exclude(fresh & Q(**services.size_for(image))).values_list("pk", flat=True))
        destroyed = sum(
            _destroy(pk, f"{vm_key(pk)} is no longer what a reservation of {image.name} takes", actor=actor) is not None
            for pk in stale
        )
        rows = [row for row in have.values_list("pk", "allocation__host_id", "allocation__end") if row[0] not in stale]
        pool = [pk for pk, _, end in rows if end is None]
        destroyed += _trim(pool, high, f"{image.name}'s warm pool is above its maximum ({high})", actor)
        wanted = Counter()
        for row in ahead:
            wanted[row.until] += row.count
        held = defaultdict(list)
        for pk, _host_id, end in rows:
            if end is not None:
                held[end].append(pk)
        for until, pks in held.items():
            destroyed += _trim(pks, wanted[until], f"{image.name}'s warm VMs ahead are more than wanted", actor)
        made = 0
        if not _failed_lately(image) and image.variants.production().exists():
            made += _request_pool(image, low - min(len(pool), high), actor=actor)
            on_host = Counter((host_id, end) for _pk, host_id, end in rows if end is not None)
            for until, count in wanted.items():
                rows_of = [row for row in ahead if row.until == until]
                made += _request_ahead(image, until, rows_of, count - len(held[until]), on_host, actor=actor)
    if destroyed and not made:
        return {"destroyed": destroyed}
    return {"requested": made, **({"destroyed": destroyed} if destroyed else {})}


def _trim(pks, keep, reason, actor):
    """Destroy the first of ``pks`` (the newest) beyond ``keep``; how many (not those a
    reservation took meanwhile)."""
    extra = pks[: max(0, len(pks) - keep)]
    return sum(_destroy(pk, reason, actor=actor) is not None for pk in extra)


def _request_pool(image, missing, *, actor):
    """Up to ``missing`` warm VMs for the pool, each where it fits; how many were requested."""
    made = 0
    for _ in range(max(0, missing)):
        try:  # claimed here, with the row: each claim sees the ones before it
            allocation = capacity.claim(demand(image), actor=actor)
        except (capacity.NoCapacity, capacity.TryAgain):
            break
        _request(image, allocation, f"{image.name}'s warm pool", actor=actor)
        made += 1
    return made


def _request_ahead(image, until, rows, missing, on_host, *, actor):
    """Up to ``missing`` warm VMs for the starts at ``until`` (``rows``: their ``Ahead``s): on
    each row's host up to its count (``on_host``: those there already) while they fit, then
    wherever the placement core finds room; how many were requested."""
    made = 0
    for row in rows:
        host = Hypervisor.objects.filter(pk=row.host_id).first()
        for _ in range(min(missing - made, row.count - on_host[row.host_id, until]) if host else 0):
            try:
                allocation = capacity.claim_on_host(host, demand(image, end=until), actor=actor)
            except capacity.NoCapacity:
                break
            _request(image, allocation, _ahead_reason(image, until), actor=actor)
            made += 1
    end = max((row.end for row in rows if row.end is not None), default=None)
    if end is None:
        return made
    # Each seat whose warm VM runs elsewhere moves there at the bell: that host's room during
    # the session is promised to it, though nothing holds it yet. Planning the next one beside
    # them keeps two seats from being sent to a host with the room of one.
    seats_hosts = {row.host_id for row in rows}
    sent = [
        host_id
        for (host_id, held_until), count in on_host.items()
        if held_until == until and host_id not in seats_hosts
        for _ in range(count)
    ]
    names = dict(Hypervisor.objects.filter(pk__in=sent).values_list("pk", "name"))
    seats = [names[host_id] for host_id in sent if host_id in names]
    while made < missing:
        allocation = _claim_elsewhere(image, until, end, seats, actor=actor)
        if allocation is None:
            break
        _request(image, allocation, _ahead_reason(image, until), actor=actor)
        seats.append(allocation.host.name)
        made += 1
    return made


def _claim_elsewhere(image, until, end, seats=(), *, actor):
    """A warm VM's claim until ``until`` on the host the placement core picks for the warm VM
    and then a seat until ``end``: a seat that takes it moves there, so the seat's room after
    ``until`` is asked for too, though only the warm VM's is held (the seat's own claim holds
    the session's room until it moves, and ``take`` re-checks it then). ``seats``: the names of
    the hosts already promised a seat each from ``until`` (counted as if claimed). None: no
    such host."""
    seat = replace(demand(image, end=end), start=until, yields=False)
    where = capacity.plan_beside(demand(image, end=end), [(name, seat) for name in seats])
    host = Hypervisor.objects.filter(name=where.host).first() if where.ok else None
    if host is None:
        return None
    try:
        return capacity.claim_on_host(host, demand(image, end=until), actor=actor)
    except capacity.NoCapacity:
        return None


def _ahead_reason(image, until):
    return f"{image.name}'s warm VMs ahead of {until:%Y-%m-%d %H:%M} UTC"


def demand(image, end=None, **options):
    """A warm VM's demand: the image's default size, from now on (or until ``end``), a claim that yields."""
    size = services.size_for(image)
    return replace(
        services.demand_for(image, size, start=timezone.now(), end=end, purpose="warm pool", **options), yields=True
    )


def _failed_lately(image):
    """Did a warm VM of the image fail within ``RETRY_AFTER`` (for want of room aside)?"""
    since = timezone.now() - RETRY_AFTER
    failed = VM.objects.filter(image=image, warm=W.WARM, state=S.FAILED, updated__gt=since)
    return failed.exclude(error__startswith="no capacity").exists()


def _request(image, allocation, reason, *, actor):
    """A warm VM on its claim (``vm.warm`` builds it there, as a reservation's VM on its own)."""
    vm = VM.objects.create(image=image, warm=W.WARM, adhoc=False, allocation=allocation, **services.size_for(image))
    VM.objects.filter(pk=vm.pk).update(name=f"warm-{vm.pk}")
    allocation.purpose = f"warm pool: vm {vm.pk}"
    allocation.save(update_fields=["purpose"])
    changelog.record(vm, "create", actor, reason=reason)
    return jobs.submit("vm.warm", {"vm": vm.pk}, actor=actor, reason=f"{vm.key}: {reason}")


def _destroy(vm_id, reason, *, actor):
    """Out of the pool at once (no one takes it meanwhile), then destroyed by its job; None,
    and nothing done, when a reservation took it since it was read: it is that reservation's."""
    if not VM.objects.filter(pk=vm_id, warm=W.WARM).update(warm=""):
        return None
    return _queue_destroy(vm_id, reason, actor=actor)


def _queue_destroy(vm_id, reason, *, actor):
    return jobs.submit("vm.destroy", {"vm": vm_id}, actor=actor, reason=reason)


def evict(allocation_ids, *, actor, reason):
    """``capacity.ON_YIELD``: the warm VMs holding these claims leave the pool, their claims are
    released and their removal is queued, in the claiming transaction; the ids of those jobs.
    ``preemption.Gone`` when one of them was taken meanwhile."""
    job_ids = []
    for allocation_id in allocation_ids:
        vm = VM.objects.select_related("allocation").filter(allocation_id=allocation_id, warm=W.WARM).first()
        if vm is None or not VM.objects.filter(pk=vm.pk, warm=W.WARM).update(warm=""):
            raise preemption.Gone(f"the warm VM of claim {allocation_id} was taken")
        capacity.release(vm.allocation, actor=actor, reason=f"{vm.key} evicted: {reason}"[:500])
        # By the pool, not the claimer: no user may act on a VM that is not theirs.
        job_ids.append(_queue_destroy(vm.pk, f"{vm.key} evicted from the warm pool: {reason}"[:400], actor=ACTOR).pk)
    return job_ids


def host_left_service(hv, old_state, *, actor):
    """``inventory.ON_STATE_CHANGE``: a host drained or taken offline keeps no warm VM. They
    leave the pool and are destroyed, never migrated (an evacuation's plan leaves them out):
    the pool's next round builds their replacements on hosts in service, for less than a move
    of a running guest costs. The warm VMs taken by reservations are those reservations' VMs,
    not touched here."""
    if hv.state == "online":
        return []
    on_host = VM.objects.filter(Q(host_id=hv.pk) | Q(allocation__host_id=hv.pk), warm=W.WARM).exclude(state__in=GONE)
    why = f"{hv.name} is {hv.state}: {hv.state_reason}"
    queued = [
        _destroy(pk, f"{vm_key(pk)} leaves the warm pool: {why}"[:400], actor=ACTOR)
        for pk in on_host.values_list("pk", flat=True)
    ]
    return [job.pk for job in queued if job is not None]


def takeable(image, size):
    """The image's warm VMs a reservation of ``size`` may take now: running on their yielding
    claim, of the production revision (new users get production); ``_candidates`` keeps those
    with their warm snapshot (a VM just booted has it a moment later)."""
    rows = VM.objects.filter(
        image=image, warm=W.WARM, state=S.RUNNING, allocation__released__isnull=True, allocation__yields=True, **size
    )
    return rows.filter(Q(revision__isnull=True) | Q(revision__state=ImageRevision.State.PRODUCTION))


def claim(image, size, demand, *, actor, owner=None):
    """A reservation's claim made where a warm VM of ``image`` runs, in that VM's room (its
    yielding claim released, the VM out of the pool), for a reservation starting now: the claim
    carries the VM as ``warm_vm`` for ``take`` (in the same transaction). None when no warm VM
    of that size is free or the demand fits on none of their hosts (then it is claimed as any
    other, and may evict warm VMs like any other)."""
    if not image.warm_max or demand.extras or demand.gpus_any:
        return None
    for vm in _candidates(image, size):
        try:
            with transaction.atomic():
                _out_of_pool(vm, f"{demand.purpose}: taken warm", actor=actor)
                allocation = capacity.claim_on_host(vm.host, demand, actor=actor, owner=owner)
        except (_Lost, capacity.NoCapacity):  # rolled back: it stays in the pool
            continue
        allocation.warm_vm = vm
        return allocation
    return None


def take(reservation, size, *, actor):
    """The warm VM for ``reservation`` (in the caller's transaction, which writes the
    reservation): ``(vm, allocation)`` — the VM, now the reservation's, ``starting`` on
    ``allocation`` — or None (none to take). The one its claim was made for (``claim``), else
    one on its claim's host, else one elsewhere whose host the claim moves to."""
    vm = getattr(reservation.allocation, "warm_vm", None)
    if vm is not None:
        return _hand_to(vm, reservation, reservation.allocation, actor=actor)
    image = reservation.image
    # (a seat of a block, a class session's, may take one warmed ahead of it: any image)
    if reservation.gpus or not (image.warm_max or reservation.block_id):
        return None
    here = reservation.allocation.host_id
    for vm in _candidates(image, size, near=here, seat=reservation.block_id is not None):
        try:
            with transaction.atomic():
                why = f"reservation {reservation.pk}: taken warm"
                _out_of_pool(vm, why, actor=actor)
                allocation = reservation.allocation
                if vm.host_id != here:  # the claim goes where the warm VM runs
                    start = max(reservation.start, timezone.now())
                    end, purpose = reservation.end, allocation.purpose
                    need = services.demand_for(image, size, start=start, end=end, purpose=purpose)
                    capacity.release(allocation, actor=actor, reason=f"moved to {vm.host.name}: {why}")
                    allocation = capacity.claim_on_host(vm.host, need, actor=actor, owner=reservation.user)
                return _hand_to(vm, reservation, allocation, actor=actor)
        except (_Lost, capacity.NoCapacity):
            continue
    return None


class _Lost(Exception):
    """The warm VM was taken first: rolled back."""


def _candidates(image, size, near=None, seat=False):
    """Warm VMs to try, those on host ``near`` first; a seat (``seat``) first those made ahead of
    seats, then the pool's; anyone else the pool's only: a class seat's warm VM is kept for the
    seat it was made for, to be ready at the bell."""
    ahead = Q(allocation__end__isnull=False)
    kind = Case(When(ahead, then=Value(0)), default=Value(1), output_field=IntegerField())
    rows = takeable(image, size).select_related("allocation", "host").annotate(kind=kind)
    if not seat:
        rows = rows.exclude(ahead)
    if near is not None:
        first = Case(When(host_id=near, then=Value(0)), default=Value(1), output_field=IntegerField())
        rows = rows.annotate(near=first).order_by("near", "kind", "pk")
    else:
        rows = rows.order_by("kind", "pk")
    return [vm for vm in rows[:CANDIDATES] if services.has_warm_snapshot(vm)]


def _out_of_pool(vm, why, *, actor):
    """Out of the pool (a conditional UPDATE: one taker wins), its yielding claim released."""
    taken = VM.objects.filter(pk=vm.pk, warm=W.WARM, allocation_id=vm.allocation_id)
    if not taken.update(warm=W.HIT, warm_takes=F("warm_takes") + 1):
        raise _Lost
    capacity.release(vm.allocation, actor=actor, reason=f"{vm.key}: {why}"[:500])


def _hand_to(vm, reservation, allocation, *, actor):
    services.set_state(
        vm.pk,
        S.STARTING,
        f"reservation {reservation.pk}: taken warm from the {reservation.image.name} pool",
        allocation=allocation,
        owner=reservation.user,
        end=reservation.end,
        name=f"res-{reservation.pk}",
        actor=actor,
    )
    vm.refresh_from_db()
    return vm, allocation


def back_to_pool(vm_id, *, actor):
    """After its reservation, a VM taken warm (reverted to its warm snapshot already) back in its
    image's pool, on a yielding claim on its host in place of the reservation's; False (nothing
    changed) when it may not be: the pool full or gone, its revision no longer production, or
    no room for it there. Counted under the image's row lock, as ``fill`` counts."""
    with transaction.atomic():
        vm = VM.objects.select_related("allocation", "host", "revision").get(pk=vm_id)
        image = Image.objects.select_for_update().get(pk=vm.image_id)
        production = vm.revision is None or vm.revision.state == ImageRevision.State.PRODUCTION
        if not image.warm_max or image.revert_on_end or not image.active or not production:
            return False
        if warm_vms(image).filter(allocation__end__isnull=True).count() >= image.warm_max or vm.warm != W.HIT:
            return False
        try:
            with transaction.atomic():
                if vm.allocation is not None:
                    capacity.release(vm.allocation, actor=actor, reason=f"{vm.key}: back to the warm pool")
                allocation = capacity.claim_on_host(vm.host, demand(image), actor=actor)
        except capacity.NoCapacity:
            return False
        allocation.purpose = f"warm pool: vm {vm.pk}"
        allocation.save(update_fields=["purpose"])
        services.set_state(
            vm_id,
            S.RUNNING,
            f"reverted to its warm snapshot, back in the {image.name} pool",
            allocation=allocation,
            owner=None,
            end=None,
            name=f"warm-{vm.pk}",
            warm=W.WARM,
            actor=actor,
        )
    return True


def mark_miss(vm_id):
    """A reservation's VM of a pooled image built cold."""
    VM.objects.filter(pk=vm_id).update(warm=W.MISS)


def counts(now=None):
    """Per pooled image (and any image with warm VMs' history): ``{name: {"min", "max", "wanted",
    "ready", "building", "ahead", "in_use", "hits", "misses"}}``, its sizes, the pool's target
    for the coming hour (``wanted_counts``) and its VMs' numbers (``ahead``: warm VMs, ready or
    building, made ahead of known starts; the same on every process and machine; 3 queries)."""
    live = Q(state__in=VM.LIVE)
    warm_live = Q(warm=W.WARM) & ~Q(state__in=GONE)
    rows = (
        VM.objects.exclude(warm="")
        .values("image__name", min=F("image__warm_min"), max=F("image__warm_max"))
        .annotate(
            ready=Count("pk", filter=Q(warm=W.WARM, state=S.RUNNING)),
            building=Count("pk", filter=Q(warm=W.WARM, state__in=(S.REQUESTED, S.STAGING, S.DEFINING, S.STARTING))),
            ahead=Count("pk", filter=warm_live & Q(allocation__end__isnull=False)),
            in_use=Count("pk", filter=Q(warm=W.HIT) & live),
            hits=Coalesce(Sum("warm_takes"), 0),
            misses=Count("pk", filter=Q(warm=W.MISS)),
        )
    )
    found = {row.pop("image__name"): row for row in rows}
    pooled = list(pooled_images())
    wanted = wanted_counts(pooled, now)
    for image in pooled:
        empty = {"ready": 0, "building": 0, "ahead": 0, "in_use": 0, "hits": 0, "misses": 0}
        found.setdefault(image.name, {"min": image.warm_min, "max": image.warm_max, **empty})
    names = {image.name: wanted[image.pk] for image in pooled}
    return {name: {"wanted": names.get(name, 0), **row} for name, row in found.items()}
