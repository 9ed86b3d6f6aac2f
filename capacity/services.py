"""Plan, claim, extend, resize, hold and release capacity. One function per verb.

``claim`` is the only writer of Allocation rows. It decides on the process's snapshot,
then, in one short transaction, locks the chosen host's row, re-checks that host against
its live allocations in the database, and writes the claim. If the host no longer fits
(another worker got there first) it refreshes the snapshot and tries again, like Ganeti's
opportunistic locking; only when attempts run out does it answer ``TryAgain``.
Two workers can never overcommit a host. No hypervisor is called from here.

Claims run inside their callers' transactions (a reservation commits with its claim), so
an attempt that finds its host full must let go of that host's lock before it tries the
next one: otherwise two claims hold one host each and wait for the other's (a deadlock on
PostgreSQL). Each attempt is a savepoint and a full host rolls it back, which releases the
row lock taken in it (releasing the savepoint would keep it). A deadlock that happens all
the same (a caller making several claims in one transaction) rolls back that attempt and
is retried like a full host.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.db import OperationalError, connection, transaction
from django.utils import timezone

import placement as core
from capacity import decisions, loaders, preemption
from capacity.models import Allocation
from capacity.snapshot import snapshot
from core import changelog, events, metrics
from core.errors import Conflict
from core.hooks import Hook
from inventory import power as inventory_power
from inventory.models import Hypervisor
from jobs import services as jobs
from jobs.models import Job
from placement import preempt, refusals

MAX_ATTEMPTS = 5
WAKE_NOTE = "fits after powering on host"  # a placement's note when a standby host would take it
POWER_ON = "node.power_on"  # provisioning.opcodes.power (above this layer: by name)

# Who else points at a claim (a reservation, above this layer) registers ``(old, new, *, actor)``
# in its ``AppConfig.ready()``; ``moved`` calls each, inside the transaction that moved it.
ON_MOVED: Hook[Callable[..., None]] = Hook("capacity.services.ON_MOVED")
# What holds claims that yield (a warm VM's, provisioning) registers ``evict(allocation ids, *,
# actor, reason)`` -> the ids of the jobs after whose end their VMs are gone. It is called inside
# the claiming transaction and must, in it, release those claims and ask for the VMs' removal,
# or raise ``preemption.Gone`` when one of them was taken meanwhile (the claim is tried again).
ON_YIELD: Hook[Callable[..., list]] = Hook("capacity.services.ON_YIELD")


class Released(Conflict):
    """The allocation was released already (perhaps after the caller read it)."""


class NoCapacity(Exception):
    """No host fits; ``result`` explains why and when it would."""

    def __init__(self, result):
        super().__init__(result.explained())
        self.result = result


class TryAgain(Exception):
    """Every chosen host was taken by a concurrent claim; nothing was written."""


@dataclass(frozen=True)
class Demand:
    """What a VM needs, when, and where it may go."""

    vcpus: float
    memory_mib: float
    disk_gib: float
    start: datetime
    end: datetime | None = None
    extras: dict = field(default_factory=dict)
    # hypervisor types the image has a variant for (``Hypervisor.serving_types``); None = any host
    hypervisors: frozenset | None = None
    required_tags: frozenset = frozenset()
    forbidden_tags: frozenset = frozenset()
    anti_affinity: str = ""
    exclusive_storage: bool = False
    policy: str | None = None
    groups: frozenset | None = None
    purpose: str = ""
    exclude_hosts: frozenset = frozenset()  # hypervisor ids not to place on (a retry after a failed boot)
    prefer_hosts: frozenset = frozenset()  # hypervisor ids tried first (they have the image cached)
    rank: int | None = None  # its priority class (``preemption.RANKS``): may suspend claims of lower ones
    image: str = ""  # the image's name, for a refusal's words (``debian-12 has no variant for VMware hosts``)
    # GPUs of any one model (``placement.devices``); N of a given model is ``extras={"gpu:<model>": N}``
    gpus_any: int = 0
    # A warm VM's: its claim yields to any other that needs its room (``ON_YIELD``); it never
    # makes room for itself (no standby host woken, nothing suspended or evicted for it).
    yields: bool = False

    def request(self, request_id="request"):
        return core.Request(
            resources=core.Resources(self.vcpus, self.memory_mib, self.disk_gib, self.extras),
            start=loaders.ts(self.start),
            end=loaders.ts(self.end),
            id=request_id,
            hypervisors=Hypervisor.serving_types(self.hypervisors),
            required_tags=frozenset(self.required_tags),
            forbidden_tags=frozenset(self.forbidden_tags),
            anti_affinity=self.anti_affinity or None,
            exclusive_storage=self.exclusive_storage,
            policy=core.Policy(self.policy) if self.policy else None,
            groups=frozenset(self.groups) if self.groups else None,
            gpus_any=self.gpus_any,
        )


def plan(demand, save_to=None):
    """Where the demand would go now, or an explained no with the earliest fit. Writes nothing
    to the database; ``save_to``: a file for the decision's input (`decisions.save`)."""
    request = demand.request()
    with snapshot.lock:
        engine, ids = snapshot.current()
        result = _variant_note(engine, demand, request, engine.place(request))
        if save_to is not None:
            decisions.save(save_to, engine, request, result, note="manage.py place --save")
    if not result.ok and not demand.yields:
        found = find_yield(demand, request)
        if found is not None:  # a claim would destroy these warm VMs first
            return replace(result, note="; ".join(n for n in (result.note, _yield_note(found)) if n))
        woken = _place_on_standby(demand, request)
        if woken is not None:
            return woken
        found = find_preemption(demand, request)
        if found is not None:  # still no host: a claim would suspend these first
            return replace(result, note="; ".join(n for n in (result.note, found.note()) if n))
    return result


def plan_beside(demand, assumed):
    """``plan`` for a claim that makes no room (a warm VM's), as if the ``assumed`` (host name,
    Demand) pairs were claimed too: room a caller has promised within one decision but not
    claimed yet. Writes nothing; the snapshot holds them only while this decides."""
    request = demand.request()
    with snapshot.lock:
        engine, _ids = snapshot.current()
        added = []
        try:
            for index, (host, other) in enumerate(assumed):
                allocation = other.request(f"assumed-{index}").as_allocation()
                engine.add_allocation(host, allocation)
                added.append(allocation.id)
            return _variant_note(engine, demand, request, engine.place(request))
        finally:
            for allocation_id in reversed(added):
                engine.remove_allocation(allocation_id)


def earliest_fit(demand, not_before=None):
    """The earliest start (≥ ``not_before``, default the demand's start) at which it fits."""
    duration = None if demand.end is None else (demand.end - demand.start).total_seconds()
    start = loaders.ts(not_before or demand.start)
    with snapshot.lock:
        engine, _ = snapshot.current()
        return engine.earliest_fit(demand.request(), duration, start)


def claim(demand, *, actor, owner=None, max_attempts=MAX_ATTEMPTS):
    """Place and record the demand; returns the Allocation. ``NoCapacity`` or ``TryAgain``."""
    request = demand.request()
    for _attempt in range(max_attempts):
        with snapshot.lock:
            engine, ids = snapshot.current()
            result = _variant_note(engine, demand, request, _decide(engine, ids, demand, request))
            if not result.ok:
                decisions.save_refused(_without(engine, ids, demand.exclude_hosts), request, result)
        if not result.ok and demand.yields:
            raise NoCapacity(result)  # a warm VM takes room only where it is free
        if not result.ok:
            allocation = _claim_yielding(demand, request, actor, owner)
            if allocation is not None:
                return allocation
            allocation = _claim_standby(demand, request, actor, owner)
            if allocation is not None:
                return allocation
            allocation = _claim_preempting(demand, request, actor, owner)
            if allocation is not None:
                return allocation
            metrics.placement_refused(result.reasons)
            raise NoCapacity(result)
        try:
            allocation = _claim_on(ids[result.host], demand, request, actor, owner)
        except OperationalError as exc:
            if not is_deadlock(exc):
                raise
            allocation = None  # this attempt was rolled back; the other transaction goes on
        if allocation is not None:
            return allocation
        snapshot.expire()  # the host changed under us: look at hosts again, not just claims
    raise TryAgain(f"hosts kept filling up under concurrent claims ({max_attempts} attempts); try again")


class GangRefused(NoCapacity):
    """A gang (``claim_gang``) has no room: ``result`` is the ``placement.GangResult`` (its
    ``note`` names the member that does not fit where; its ``earliest_fit`` the earliest start
    for all)."""


def claim_gang(demands, together=(), *, actor, owner=None, gang_id="gang", max_attempts=MAX_ATTEMPTS):
    """Place and record several demands all or nothing (an environment's machines); returns
    ``{member id: Allocation}``. ``demands``: ``{member id: Demand}``, one window for all;
    ``together``: sets of member ids that must share a host (``placement.gang``). The hosts
    any demand excludes (``exclude_hosts``: a retry after a failed build) take none of them.

    The gang is placed on the snapshot as one decision, then each member is claimed on its
    host in one savepoint: a member whose host filled up meanwhile rolls every claim of the
    gang back (nothing of it stays), and the gang is placed again. No standby host is woken
    and nothing is suspended for a gang: it fits as the hosts are, or it is refused.
    ``GangRefused`` or ``TryAgain``."""
    requests = {member: demand.request(member) for member, demand in demands.items()}
    gang = core.Gang(members=tuple(requests.values()), together=tuple(together), id=gang_id)
    for _attempt in range(max_attempts):
        with snapshot.lock:
            engine, ids = snapshot.current()
            excluded = frozenset().union(*(d.exclude_hosts for d in demands.values()))
            result = core.place_gang(_without(engine, ids, excluded), gang)
        if not result.ok:
            metrics.placement_refused(dict(result.results[-1].reasons) if result.results else {})
            raise GangRefused(result)
        claimed = _claim_members(demands, requests, result.hosts, ids, actor, owner)
        if claimed is not None:
            return claimed
        snapshot.expire()
    raise TryAgain(f"hosts kept filling up under concurrent claims ({max_attempts} attempts); try again")


class _GangFull(Exception):
    """A member's host no longer fits: rolls the gang's savepoint (every member's claim) back."""


def _claim_members(demands, requests, hosts, ids, actor, owner):
    """Every member's claim on the host chosen for it, or None (nothing written) when one no
    longer fits or a deadlock rolled the attempt back."""
    try:
        with transaction.atomic():
            claimed = {}
            for member, host in hosts.items():
                allocation = _claim_on(ids[host], demands[member], requests[member], actor, owner)
                if allocation is None:
                    raise _GangFull
                claimed[member] = allocation
            return claimed
    except _GangFull:
        return None
    except OperationalError as exc:
        if not is_deadlock(exc):
            raise
        return None


def _decide(engine, ids, demand, request):
    """Where the demand goes: among the preferred hosts (image cached there) if one of them
    fits and is not a last-resort host; otherwise by the whole cluster's policy."""
    engine = _without(engine, ids, demand.exclude_hosts)
    preferred = _among(engine, ids, demand.prefer_hosts - demand.exclude_hosts)
    if preferred is not None:
        result = preferred.place(request)
        if result.ok and engine.state.groups[result.group].alloc_policy == core.AllocPolicy.PREFERRED:
            return result
    return engine.place(request)


def _variant_note(engine, demand, request, result):
    """A refusal of hosts of the wrong hypervisor type says which image lacks which variant
    (``debian-guest has no variant for simulated hosts``): the counts alone read "wrong
    hypervisor type", which tells the user nothing they can act on."""
    if result.ok or not demand.image or not result.reasons.get(refusals.WRONG_HYPERVISOR):
        return result
    types = {slot.host.hypervisor for slot in engine.state.slots} - set(request.hypervisors or ())
    missing = " or ".join(sorted(Hypervisor.HV_LABELS.get(t, t) for t in types))
    note = f"{demand.image} has no variant for {missing} hosts"
    return replace(result, note="; ".join(n for n in (result.note, note) if n))


def _among(engine, ids, host_ids, wake=False):
    """A small engine over just these hosts (cheap: a handful of hosts), or None; ``wake``
    counts them online (standby hosts, as if powered on)."""
    state = engine.state
    names = [name for name, pk in ids.items() if pk in host_ids and name in state.by_name]
    if not names:
        return None
    changes = {"state": core.HostState.ONLINE} if wake else {}
    hosts = tuple(
        replace(state.slots[state.by_name[n]].host, allocations=state.allocations_on(n), **changes) for n in names
    )
    return core.PlacementEngine(replace(state.cluster, hosts=hosts), snapshot.options)


# --- power on for demand: a standby host (vclmgr powered it off) as the last candidate ----


def _place_on_standby(demand, request):
    """Where the demand would go among the standby hosts, as if powered on; None if nowhere."""
    standby = inventory_power.standby_hosts() - set(demand.exclude_hosts)
    if not standby:
        return None
    with snapshot.lock:
        engine, ids = snapshot.current()
        woken = _among(engine, ids, standby, wake=True)
    if woken is None:
        return None
    result = woken.place(request)
    if not result.ok:
        return None
    return replace(result, note=f"{WAKE_NOTE} {result.host}")


def _claim_standby(demand, request, actor, owner):
    """Claim on a standby host and submit ``node.power_on`` for it (in the caller's transaction,
    so the claim and the job commit together); None when no standby host fits."""
    for _attempt in range(MAX_ATTEMPTS):
        result = _place_on_standby(demand, request)
        if result is None:
            return None
        host = Hypervisor.objects.only("pk", "name").get(name=result.host)
        allocation = _claim_on(host.pk, demand, request, actor, owner, wake=True)
        if allocation is not None:
            allocation.placement_note = result.note
            allocation.power_on_job = power_on_for(host, demand.purpose, actor=actor)
            return allocation
        snapshot.expire()
    return None


# --- claims that yield: warm VMs destroyed to make room for any other claim ----------------


def find_yield(demand, request=None):
    """Where the demand would fit once claims that yield (warm VMs') are let go (a
    ``preemption.Found`` naming the fewest), or None: a demand that yields itself, none to let
    go, or no host where it would help."""
    if demand.yields or not ON_YIELD:
        return None
    rows = Allocation.objects.filter(yields=True, released__isnull=True).exclude(host_id__in=demand.exclude_hosts)
    rows = list(rows.values_list("pk", "host_id"))
    if not rows:
        return None
    request = request or demand.request()
    with snapshot.lock:
        engine, ids = snapshot.current()
        hosts = _among(engine, ids, {host_id for _, host_id in rows})
        if hosts is None:
            return None
        victims = [preempt.Preemptible(str(pk), 0, "warm VM") for pk, _ in rows]
        found = preempt.plan(hosts.snapshot(), request, 1, victims, shrink=preempt.nothing)
    return None if found is None else preemption.Found(found, ids[found.host], {})


def _yield_note(found):
    """``fits if 2 warm VMs are destroyed``."""
    victims = found.plan.victims
    return f"{preempt.NOTE}{found.plan.what()} {'is' if len(victims) == 1 else 'are'} destroyed"


def _claim_yielding(demand, request, actor, owner):
    """Let go of the fewest claims that yield where the demand then fits, and claim there
    (``_claim_making_room``; ``preempt_jobs``: the removals of those VMs, which its VM's build
    waits for). None when letting them go helps nowhere."""

    def evict(found):
        ids = [int(victim.allocation) for victim in found.plan.victims]
        why = f"{demand.purpose or 'a claim'} needs the room of {found.plan.what()}"[:400]
        return [job for evict in ON_YIELD for job in evict(ids, actor=actor, reason=why)]

    return _claim_making_room(
        demand, request, actor, owner, find_yield, evict, lambda found: f"{found.plan.what()} destroyed to make room"
    )


def _claim_making_room(demand, request, actor, owner, find, free, note):
    """``find(demand, request)`` the claims whose room the demand needs, ``free(found)`` them
    (-> the jobs that do it) and claim there, in one savepoint (the caller's transaction commits
    both or neither); the claim carries ``preempt_jobs`` (what must end before its VM is built)
    and its ``placement_note`` (``note(found)``). None when nothing helps."""
    for _attempt in range(MAX_ATTEMPTS):
        found = find(demand, request)
        if found is None:
            return None
        try:
            with transaction.atomic():
                waits = free(found)
                allocation = _claim_locked(found.host_id, demand, request, actor, owner)
        except (_Full, preemption.Gone):  # rolled back, what was freed too: look again
            snapshot.expire()
            continue
        allocation.placement_note = note(found)
        allocation.preempt_jobs = waits
        return allocation
    return None


# --- suspend instead of preempt: lower-class claims shrunk to their disk (``preemption``) ----


def find_preemption(demand, request=None):
    """Where the demand would fit once lower-class claims are suspended (a ``preemption.Found``
    naming the fewest), or None: no rank, no candidates, or no host where it would help."""
    if demand.rank is None or not preemption.HOLDERS:
        return None
    candidates = [c for c in preemption.candidates() if c[0] not in demand.exclude_hosts]
    if not candidates:
        return None
    request = request or demand.request()
    with snapshot.lock:
        engine, ids = snapshot.current()
        hosts = _among(engine, ids, {host_id for host_id, _, _ in candidates})
        if hosts is None:
            return None
        found = preempt.plan(hosts.snapshot(), request, demand.rank, [victim for _, victim, _ in candidates])
    if found is None:
        return None
    holders = {victim.allocation: holder for _, victim, holder in candidates}
    return preemption.Found(found, ids[found.host], holders)


def preemption_note(result):
    """``fits if 2 batch runs are suspended`` when ``plan`` found that a claim would suspend
    runs to fit (a refusal still: nothing is suspended by a plan), else ""."""
    for part in (result.note or "").split("; "):
        if part.startswith(preempt.NOTE):
            return part
    return ""


def _claim_preempting(demand, request, actor, owner):
    """Suspend the fewest lower-class claims that make room and claim there
    (``_claim_making_room``). None when nothing helps."""

    def suspend(found):
        return preemption.suspend(
            found, actor=actor, reason=f"{demand.purpose or 'a claim'} of a higher class: {found.note()}"[:400]
        )

    return _claim_making_room(
        demand, request, actor, owner, find_preemption, suspend, lambda found: f"suspending {found.plan.what()}"
    )


def power_on_for(host, purpose, *, actor):
    """The id of the pending ``node.power_on`` of this standby host, or of a new one."""
    pending = (
        Job.objects.filter(
            opcode=POWER_ON,
            params__node=host.name,
            status__in=(Job.Status.QUEUED, Job.Status.WAITING, Job.Status.RUNNING),
        )
        .values_list("pk", flat=True)
        .first()
    )
    if pending is not None:
        return pending
    reason = f"demand: {purpose or 'a claim'} fits only after powering on {host.name}"[:400]
    return jobs.submit(POWER_ON, {"node": host.name, "reason": reason}, actor=actor, reason=reason).pk


def last_power_on(host):
    """The host's latest ``node.power_on`` job, or None."""
    return Job.objects.filter(opcode=POWER_ON, params__node=host.name).order_by("-pk").first()


def _without(engine, ids, exclude):
    """The engine itself, or (rarely: retries only) a copy in which the excluded hosts take no new VMs."""
    if not exclude:
        return engine
    cluster = engine.snapshot()
    hosts = tuple(
        replace(host, state=core.HostState.DRAINED) if ids.get(host.name) in exclude else host for host in cluster.hosts
    )
    return core.PlacementEngine(replace(cluster, hosts=hosts), snapshot.options)


def claim_on_host(host, demand, *, actor, owner=None):
    """Claim on a given host (migration target, admin override); ``NoCapacity`` if it does not fit."""
    allocation = _claim_on(host.pk, demand, demand.request(), actor, owner)
    if allocation is None:
        with transaction.atomic():
            result = _host_check(host.pk, demand.request())
        raise NoCapacity(result)
    return allocation


def _host_check(host_id, request, lock=False, wake=False):
    """Does the request fit this host, by the database? (Locks the host row when asked.)
    ``wake``: a host still on standby counts as online (it is about to be powered on)."""
    return _checked_host(host_id, request, lock, wake)[0]


def _checked_host(host_id, request, lock=False, wake=False):
    """``_host_check``'s result, and the host as it read it (None: deleted)."""
    tags = bool(request.required_tags or request.forbidden_tags)
    cluster = loaders.load_host(host_id, timezone.now(), lock=lock, tags=tags)
    if cluster is None:
        return core.PlacementResult(request, None, note="the host was deleted"), None
    if wake:
        if host_id not in inventory_power.standby_hosts([host_id]):
            return core.PlacementResult(request, None, note="the host is no longer on standby"), cluster.hosts[0]
        cluster = replace(cluster, hosts=tuple(replace(h, state=core.HostState.ONLINE) for h in cluster.hosts))
    # Capacity only: on one host every policy agrees, and an external program must not run again.
    request = replace(request, policy=core.Policy.BALANCED)
    return core.PlacementEngine(cluster, core.PlacementOptions(earliest_fit=False)).place(request), cluster.hosts[0]


def is_deadlock(exc):
    """Was this database error PostgreSQL's "deadlock detected" (its transaction, or the
    savepoint it happened in, is rolled back and may simply run again)?"""
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == "40P01" or getattr(cause, "pgcode", None) == "40P01"


class _Full(Exception):
    """The host no longer fits: rolls the attempt's savepoint back, and with it its row lock."""


def _claim_on(host_id, demand, request, actor, owner, wake=False):
    try:
        return _claim_locked(host_id, demand, request, actor, owner, wake)
    except _Full:
        return None


def _claim_locked(host_id, demand, request, actor, owner, wake=False):
    """Re-check the host under its lock and write the claim; ``_Full`` when it no longer fits.
    The claim carries ``host_name`` and ``host_type`` (the host's name and hypervisor type as
    checked: the caller needs no read of them)."""
    # Its own savepoint gives the host's row lock back when the host no longer fits, and lets a
    # deadlock be retried (PostgreSQL). SQLite has neither (its write transaction serialises
    # every claim): in a caller's transaction the claim is written in it, with no savepoint.
    # In a caller's transaction its change-log row and event are made after the savepoint (if
    # any) is released, so they join the caller's batch (``transitions.batched``), if any, rather
    # than being written at once inside it; they commit or roll back with the claim all the same.
    if not connection.in_atomic_block:
        with transaction.atomic():
            return _recorded(_write_claim(host_id, demand, request, owner, wake), demand, actor)
    if connection.features.has_select_for_update:
        with transaction.atomic():
            allocation = _write_claim(host_id, demand, request, owner, wake)
    else:
        allocation = _write_claim(host_id, demand, request, owner, wake)
    return _recorded(allocation, demand, actor)


def _recorded(allocation, demand, actor):
    """The claim's change-log row and event (in the transaction that wrote it)."""
    changelog.record(allocation, "create", actor, reason=demand.purpose)
    events.emit("allocation.claimed", _event(allocation), [f"hypervisor.{allocation.host_id}", "admin"])
    return allocation


def _write_claim(host_id, demand, request, owner, wake):
    checked, host = _checked_host(host_id, request, lock=True, wake=wake)
    if not checked.ok:
        raise _Full  # (before any write: nothing to roll back without a savepoint)
    allocation = Allocation.objects.create(
        host_id=host_id,
        owner=owner,
        purpose=demand.purpose[:200],
        vcpus=demand.vcpus,
        memory_mib=demand.memory_mib,
        disk_gib=demand.disk_gib,
        # as checked: an any-model GPU demand is claimed as the model the host gave it
        extras=dict(checked.request.resources.extras),
        start=demand.start,
        end=demand.end,
        anti_affinity=demand.anti_affinity,
        yields=demand.yields,
    )
    allocation.host_name, allocation.host_type = checked.host, host.hypervisor
    return allocation


def extend(allocation, new_end, *, actor):
    """Move an allocation's end; re-checked under the host's lock. Returns the new row
    (the old one is released in the same transaction), or raises ``NoCapacity``; ValueError
    when the allocation is released already — also when that happened after the caller read
    it (a conditional update: an end racing the extend must not leave a fresh claim behind)."""
    if allocation.released is not None:
        raise Released("this allocation was released")
    demand = demand_of(allocation, end=new_end)
    request = demand.request()
    with transaction.atomic():
        Hypervisor.objects.select_for_update().get(pk=allocation.host_id)
        released = Allocation.objects.filter(pk=allocation.pk, released__isnull=True).update(released=timezone.now())
        if released != 1:
            raise Released("this allocation was released")
        fresh = _claim_on(allocation.host_id, demand, request, actor, allocation.owner)
        if fresh is None:
            raise NoCapacity(_host_check(allocation.host_id, request))  # rolls the release back
        changelog.record(allocation, "update", actor, {"end": [str(allocation.end), str(new_end)]}, "extended")
    return fresh


def resize(allocation, *, actor, reason, check=True, **size):
    """Give a claim another size (``vcpus``, ``memory_mib``, ``disk_gib``) on its own host for
    the rest of its window: the old row released and a fresh one written in one transaction
    (never both counted, never neither; snapshots follow new and released rows, never an edited
    one), then its holders repointed (``moved``). A claim that grows is re-checked under the
    host's lock with its old self not counted: ``NoCapacity`` explains a refusal, and nothing
    changes. One that only shrinks is written unchecked: it fits wherever its larger self did;
    so is any with ``check`` False (a size the VM still has: a failed resize undone, a fact
    recorded as ``hold`` does). ``Released``: it was released."""
    if allocation.released is not None:
        raise Released("this allocation was released")
    demand = demand_of(allocation, **size)
    grows = check and any(size[name] > getattr(allocation, name) for name in size)
    changes = {name: [getattr(allocation, name), new] for name, new in size.items() if new != getattr(allocation, name)}
    with transaction.atomic():
        Hypervisor.objects.select_for_update().get(pk=allocation.host_id)
        released = Allocation.objects.filter(pk=allocation.pk, released__isnull=True).update(released=timezone.now())
        if released != 1:
            raise Released("this allocation was released")
        if grows:
            fresh = _claim_on(allocation.host_id, demand, demand.request(), actor, allocation.owner)
            if fresh is None:
                raise NoCapacity(_host_check(allocation.host_id, demand.request()))  # rolls the release back
        else:
            fresh = _recorded(_copy(allocation, **size), demand, actor)
        changelog.record(allocation, "update", actor, changes, reason[:500])
        moved(allocation, fresh, actor=actor)
    return fresh


def _copy(allocation, **changes):
    """A fresh row of ``allocation`` with ``changes``, written with no capacity check."""
    fields = ("host_id", "owner_id", "purpose", "vcpus", "memory_mib", "disk_gib", "start", "end", "anti_affinity")
    values = {name: getattr(allocation, name) for name in fields}
    return Allocation.objects.create(**{**values, "extras": dict(allocation.extras), **changes})


def moved(old, new, *, actor):
    """Tell every registered holder that what ``old`` stood for is now counted by ``new``."""
    for follow in ON_MOVED:
        follow(old, new, actor=actor)


def replace_claim(old, demand, *, actor, reason):
    """Claim ``demand`` elsewhere and release ``old`` in one transaction (never both counted
    after it, never neither), then repoint its holders; ``NoCapacity``/``TryAgain`` change nothing."""
    if old.released is not None:
        raise Released("this allocation was released")
    with transaction.atomic():
        fresh = claim(demand, actor=actor, owner=old.owner)
        if not release(old, actor=actor, reason=f"{reason}: moved to {fresh.host.name}"[:500]):
            raise Released("this allocation was released")  # meanwhile: rolls the fresh claim back
        moved(old, fresh, actor=actor)
    return fresh


def claims_end(host_id):
    """When the host's current claims end: the latest end of its unreleased claims (now if
    none; an open-ended VM has no end to wait for, it stays on the drained host). Registered
    in ``inventory.services.CLAIMS_END``; called under the host's row lock, so a claim racing
    a scheduled drain is either counted in the moment or sees the limit."""
    ends = Allocation.objects.filter(host_id=host_id, released__isnull=True, end__isnull=False)
    return max([timezone.now(), *ends.values_list("end", flat=True)])


def scheduled_due(now=None):
    """Hosts whose scheduled state change is due: no unreleased claim ends after ``now``."""
    now = now or timezone.now()
    scheduled = list(Hypervisor.objects.exclude(scheduled_state="").order_by("pk"))  # every tick: usually none
    if not scheduled:
        return []
    ids = [host.pk for host in scheduled]
    pending = set(
        Allocation.objects.filter(host_id__in=ids, released__isnull=True, end__gt=now).values_list("host_id", flat=True)
    )
    return [host for host in scheduled if host.pk not in pending]


def apply_scheduled(now=None, *, actor):
    """Make each due scheduled state change (the reservations clock calls this). Returns the
    host names changed. Idempotent: ``set_state`` clears the schedule it fulfils."""
    from inventory import services as inventory

    done = []
    for host in scheduled_due(now):
        with transaction.atomic():
            locked = Hypervisor.objects.select_for_update().get(pk=host.pk)
            later = Allocation.objects.filter(host_id=host.pk, released__isnull=True, end__gt=now or timezone.now())
            if not locked.scheduled_state or later.exists():  # canceled, or claimed meanwhile: not yet
                continue
            why = f"{locked.scheduled_reason} (scheduled by {locked.scheduled_by}: its reservations have ended)"
            inventory.set_state(locked, locked.scheduled_state, why[:500], actor=actor)
        done.append(host.name)
    return done


def release(allocation, *, actor, reason=""):
    """Give the capacity back (idempotent)."""
    with transaction.atomic():
        updated = Allocation.objects.filter(pk=allocation.pk, released__isnull=True).update(released=timezone.now())
        if updated:
            allocation.refresh_from_db()
            changelog.record(allocation, "delete", actor, reason=reason or "released")
            events.emit("allocation.released", _event(allocation), [f"hypervisor.{allocation.host_id}", "admin"])
    return bool(updated)


def hold(allocation, *, actor, reason):
    """Keep a claim counted with no end, because what it stands for (a VM whose removal
    failed) may still be on the host whatever its end said. Returns the open-ended claim.

    A fresh row replaces the old one (released in the same transaction): snapshots catch up
    on new and released rows, never on an edited end. No capacity check: this records a fact,
    not a request, and a host that ends up overcommitted by it really is. Released rows are
    held again too (a VM found on a host is there whether or not its claim was let go)."""
    if allocation.released is None and allocation.end is None:
        return allocation
    now = timezone.now()
    with transaction.atomic():
        Hypervisor.objects.select_for_update().get(pk=allocation.host_id)
        Allocation.objects.filter(pk=allocation.pk, released__isnull=True).update(released=now)
        held = Allocation.objects.create(
            host_id=allocation.host_id,
            owner_id=allocation.owner_id,
            purpose=allocation.purpose,
            vcpus=allocation.vcpus,
            memory_mib=allocation.memory_mib,
            disk_gib=allocation.disk_gib,
            extras=dict(allocation.extras),
            start=min(allocation.start, now),
            end=None,
            anti_affinity=allocation.anti_affinity,
        )
        changelog.record(held, "create", actor, reason=f"held: {reason}"[:500])
        events.emit("allocation.claimed", _event(held), [f"hypervisor.{held.host_id}", "admin"])
    return held


def claim_disk(host_id, disk_gib, *, purpose, actor, replaces=None):
    """Claim only disk on a host, with no end, in place of ``replaces`` (released in the same
    transaction): what a VM kept stopped on its host (a parked one) still occupies there.
    A fresh row, as ``hold`` writes, and no capacity check: the disk is on the host already."""
    now = timezone.now()
    with transaction.atomic():
        Hypervisor.objects.select_for_update().get(pk=host_id)
        if replaces is not None:
            release(replaces, actor=actor, reason=f"replaced: {purpose}"[:500])
        claimed = Allocation.objects.create(
            host_id=host_id, purpose=purpose[:200], vcpus=0, memory_mib=0, disk_gib=disk_gib, start=now, end=None
        )
        changelog.record(claimed, "create", actor, reason=purpose)
        events.emit("allocation.claimed", _event(claimed), [f"hypervisor.{host_id}", "admin"])
    return claimed


def demand_of(allocation, **changes):
    values = {
        "vcpus": allocation.vcpus,
        "memory_mib": allocation.memory_mib,
        "disk_gib": allocation.disk_gib,
        "extras": dict(allocation.extras),
        "start": allocation.start,
        "end": allocation.end,
        "anti_affinity": allocation.anti_affinity,
        "purpose": allocation.purpose,
    }
    values.update(changes)
    return Demand(**values)


def _event(allocation):
    return {
        "id": allocation.pk,
        "host": allocation.host_id,
        "purpose": allocation.purpose,
        "start": allocation.start.isoformat(),
        "end": allocation.end.isoformat() if allocation.end else None,
    }


# ``lookup(name, user) -> frozenset`` of an image's hypervisor types: images live in the layer
# above, which fills it at start-up (provisioning's AppConfig.ready).
IMAGE_TYPES: Hook[Callable[..., frozenset]] = Hook("capacity.services.IMAGE_TYPES", single=True)


def image_types(name, user=None):
    """The hypervisor types an image has variants for (placement restricts hosts to them);
    LookupError when there is no such image — or none ``user`` may use: the same answer, so
    restricted image names cannot be probed."""
    lookup = IMAGE_TYPES.one()
    if lookup is None:
        raise LookupError(f"no image named {name!r} (no image catalogue is installed)")
    return lookup(name, user)
