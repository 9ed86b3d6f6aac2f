"""Gangs: several VMs placed all or nothing, some of them on one host together.

An environment (a router and two clients; three database nodes) is one reservation of
several VMs. Its members on one private network share a host unless the hosts share an
overlay network, so a `Gang` names its members (plain `Request`s, one window for all) and
the sets of them that must be together (``together``): on one host, or spread over hosts of
one overlay (`Host.overlay`: the operator's network between those hosts, which can carry a
private network across them). A member in no set goes wherever it fits.

Contract: `place_gang` places every member or none. Each set is placed as one request whose
resources are its members' sum (``vms`` = how many), so a host is chosen only if the whole
set fits there for the whole window; when no host does, its members are placed one by one
on the hosts of one overlay (each overlay in name order, the first where all fit); sets and
lone members are then placed in turn, each seeing the ones before it. A refusal names the
unit that did not fit and, for a set, the first of its members that no longer fits on the
host that came closest, and gives the earliest start at which the whole gang fits. With
``commit`` the members are recorded one by one on their hosts (so a host's VM count and
every timeline see each of them).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import devices
from .engine import PlacementEngine
from .model import Policy, Request
from .result import EarliestFit, PlacementResult
from .search import evaluate
from .vectors import Resources

#: Candidate starts tried when a gang spans several hosts (each one a full trial placement).
SEARCH_LIMIT = 400


@dataclass(frozen=True, slots=True)
class Gang:
    members: tuple[Request, ...]
    #: Sets of member ids that must share one host.
    together: tuple[frozenset[str], ...] = ()
    id: str = "gang"

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(self.members))
        object.__setattr__(self, "together", tuple(frozenset(s) for s in self.together))
        ids = [m.id for m in self.members]
        if not ids:
            raise ValueError(f"gang {self.id}: no members")
        if len(set(ids)) != len(ids):
            raise ValueError(f"gang {self.id}: member ids repeat")
        windows = {(m.start, m.end) for m in self.members}
        if len(windows) > 1:
            raise ValueError(f"gang {self.id}: its members must share one window")
        seen: set[str] = set()
        for group in self.together:
            unknown = group - set(ids)
            if unknown:
                raise ValueError(f"gang {self.id}: no member {sorted(unknown)[0]!r}")
            if group & seen:
                raise ValueError(f"gang {self.id}: member {sorted(group & seen)[0]!r} is in two sets")
            seen |= group
            _check_anti_affinity(self.id, [m for m in self.members if m.id in group])

    @property
    def start(self) -> float:
        return self.members[0].start

    @property
    def end(self) -> float | None:
        return self.members[0].end

    def units(self) -> list[tuple[Request, tuple[Request, ...]]]:
        """(the request placed, the members it stands for): one per set, one per lone
        member; the largest first (by memory, then vCPUs), so big sets choose before small
        members fill the hosts they need."""
        by_id = {m.id: m for m in self.members}
        sets = [sorted(group) for group in self.together if len(group) > 1]
        units = [(combined(self.id, [by_id[i] for i in ids]), tuple(by_id[i] for i in ids)) for ids in sets]
        shared = {i for ids in sets for i in ids}
        units += [(m, (m,)) for m in self.members if m.id not in shared]
        return sorted(units, key=lambda u: (-u[0].resources.memory_mib, -u[0].resources.vcpus, u[0].id))

    def shifted(self, start: float, duration: float | None) -> Gang:
        return dataclasses.replace(self, members=tuple(m.shifted(start, duration) for m in self.members))


def _check_anti_affinity(gang_id: str, members: list[Request]) -> None:
    """Members that must share a host cannot keep apart: two of one anti-affinity group (which
    never share a host) and members naming different groups (one host request holds one) are
    refused here, before any placement."""
    named = sorted((m.anti_affinity, m.id) for m in members if m.anti_affinity)
    for (group, a), (same, b) in itertools.pairwise(named):
        if group == same:
            raise ValueError(
                f"gang {gang_id}: {a} and {b} must share a host but are both in anti-affinity group {group}, "
                "which keeps its members on different hosts"
            )
    groups = sorted({group for group, _ in named})
    if len(groups) > 1:
        raise ValueError(
            f"gang {gang_id}: members that must share a host name different anti-affinity groups "
            f"({', '.join(groups)}): give them one group, or none"
        )


def combined(gang_id: str, members: list[Request]) -> Request:
    """One request for members that share a host: their resources summed, every member's
    host rules at once (tags required or forbidden by any, hypervisor types and node groups
    acceptable to all)."""
    first = members[0]
    resources = sum((m.resources for m in members[1:]), first.resources)
    hypervisors = _intersection(m.hypervisors for m in members)
    groups = _intersection(m.groups for m in members)
    affinity = {m.anti_affinity for m in members if m.anti_affinity}
    if len(affinity) > 1:
        raise ValueError(f"gang {gang_id}: members sharing a host name different anti-affinity groups")
    any_model = sum(m.gpus_any for m in members)
    return dataclasses.replace(
        first,
        id=f"{gang_id}:{'+'.join(m.id for m in members)}",
        resources=resources,
        hypervisors=hypervisors,
        groups=groups,
        required_tags=frozenset().union(*(m.required_tags for m in members)),
        forbidden_tags=frozenset().union(*(m.forbidden_tags for m in members)),
        exclusive_storage=any(m.exclusive_storage for m in members),
        tags=frozenset().union(*(m.tags for m in members)),
        anti_affinity=next(iter(affinity), None),
        gpus_any=any_model,
        vms=sum(m.vms for m in members),
    )


def _intersection(values: Iterable[frozenset[str] | None]) -> frozenset[str] | None:
    result = None
    for value in values:
        if value is not None:
            result = value if result is None else result & value
    return result


@dataclass(frozen=True, slots=True)
class GangResult:
    gang: Gang
    #: member id -> host (every member when placed; empty when refused).
    hosts: dict[str, str] = field(default_factory=dict)
    #: The placements of the units tried, in order (the last one refused, when refused).
    results: tuple[PlacementResult, ...] = ()
    note: str = ""
    earliest_fit: EarliestFit | None = None

    @property
    def ok(self) -> bool:
        return len(self.hosts) == len(self.gang.members)

    def explained(self) -> str:
        if self.ok:
            return f"{self.gang.id}: " + ", ".join(f"{m} on {h}" for m, h in self.hosts.items())
        parts = [self.note]
        if self.earliest_fit is not None:
            parts.append(str(self.earliest_fit))
        return f"{self.gang.id}: " + "; ".join(p for p in parts if p)

    def to_dict(self) -> dict:
        return {
            "gang": self.gang.id,
            "ok": self.ok,
            "hosts": dict(self.hosts),
            "note": self.note,
            "refusal": self.results[-1].to_dict() if self.results and not self.ok else None,
            "earliest_fit": self.earliest_fit.to_dict() if self.earliest_fit else None,
        }


def place_gang(engine: PlacementEngine, gang: Gang, *, commit: bool = False, earliest: bool = True) -> GangResult:
    """Every member of ``gang`` on a host, or none (see the module's contract)."""
    recorded: list[str] = []
    hosts: dict[str, str] = {}
    results: list[PlacementResult] = []
    refused = None
    for unit, members in gang.units():
        result, placed = _place_unit(engine, unit, members)
        results.append(result)
        if placed is None:
            refused = (unit, members, result)
            break
        recorded += placed
        hosts.update(placed)
    if refused is None and commit:
        return GangResult(gang, hosts, tuple(results))
    for member_id in reversed(recorded):
        engine.remove_allocation(member_id)
    if refused is None:
        return GangResult(gang, hosts, tuple(results))
    unit, members, result = refused
    note = _refusal_note(engine, gang, unit, members, result)
    fit = earliest_gang_fit(engine, gang) if earliest else None
    return GangResult(gang, {}, tuple(results), note, fit)


def _place_unit(engine, unit, members) -> tuple[PlacementResult, dict[str, str] | None]:
    """Place one unit and record its members: on one host, or else (a set) spread over the
    hosts of one overlay. Returns the unit's placement and ``{member id: host}`` (None when
    refused; then nothing of it is recorded)."""
    result = engine.place(unit)
    if result.ok:
        placed = {}
        for member in _as_placed(unit, members, result):
            engine.add_allocation(result.host, member.as_allocation())
            placed[member.id] = result.host
        return result, placed
    if len(members) > 1:
        for overlay in overlays(engine):
            spread = _spread(engine, members, overlay)
            if spread is not None:
                return spread
    return result, None


def overlays(engine: PlacementEngine) -> list[str]:
    """The overlay networks of the engine's hosts, in name order."""
    return sorted({slot.host.overlay for slot in engine.state.slots if slot.host.overlay is not None})


def _spread(engine, members, overlay) -> tuple[PlacementResult, dict[str, str]] | None:
    """Each member on a host of ``overlay``, one by one (the largest first), each seeing the
    ones before it, recorded; or None, nothing recorded, when one does not fit."""
    order = sorted(members, key=lambda m: (-m.resources.memory_mib, -m.resources.vcpus, m.id))
    placed: dict[str, str] = {}
    result = None
    for member in order:
        result = engine.place(dataclasses.replace(member, overlay=overlay))
        if not result.ok:
            for member_id in reversed(placed):
                engine.remove_allocation(member_id)
            return None
        engine.add_allocation(result.host, dataclasses.replace(result.request, id=member.id).as_allocation())
        placed[member.id] = result.host
    return result, placed


def _as_placed(unit, members, result) -> tuple[Request, ...]:
    """The members as placed: an any-model GPU ask becomes the model the unit got."""
    if len(members) == 1:
        return (dataclasses.replace(result.request, id=members[0].id),)
    if not unit.gpus_any:
        return members
    model = next(iter(devices.asked(result.request)), "").removeprefix(devices.PREFIX)
    return tuple(devices.concrete(m, model) if m.gpus_any else m for m in members)


def _refusal_note(engine, gang, unit, members, result) -> str:
    """Why ``unit`` does not fit, without its own earliest fit: the gang's, for every member,
    is the one to say (``GangResult.earliest_fit``)."""
    result = dataclasses.replace(result, earliest_fit=None)
    if len(members) == 1:
        return f"member {members[0].id} does not fit: {result.explained()}"
    need = _amount(unit.resources)
    where = "a host, or hosts of one overlay network," if overlays(engine) else "a host"
    note = f"members {', '.join(m.id for m in members)} must share {where} and together need {need}"
    closest = result.closest_misses[0].host if result.closest_misses else None
    if closest is not None:
        first_out = _first_that_does_not_fit(engine, closest, members)
        if first_out is not None:
            note += f"; on {closest}, the closest, {first_out} is the first that does not fit"
    why = result.explained()
    return f"{note}: {why}" if why else note


def _first_that_does_not_fit(engine, host, members) -> str | None:
    """Which member, added to ``host`` one by one after the ones before it, no longer fits."""
    idx = engine.state.by_name[host]
    added: list[str] = []
    try:
        for member in members:
            if evaluate(engine.state, engine._window(member), idx, Policy.PACK) is None:
                return member.id
            engine.add_allocation(host, member.as_allocation())
            added.append(member.id)
        return None
    finally:
        for member_id in reversed(added):
            engine.remove_allocation(member_id)


def _amount(resources: Resources) -> str:
    parts = [f"{resources.vcpus:g} vCPUs", f"{resources.memory_mib:g} MiB", f"{resources.disk_gib:g} GiB"]
    parts += [f"{v:g} {k}" for k, v in sorted(resources.extras.items())]
    return ", ".join(parts)


def earliest_gang_fit(
    engine: PlacementEngine, gang: Gang, duration: float | None = math.nan, not_before: float | None = None
) -> EarliestFit:
    """The earliest start at which the whole gang fits for ``duration`` (default: its own).

    One unit (a set or a lone member; a set that no overlay could spread): the engine's
    exact search. Otherwise the candidates
    are the start asked and every later moment a claim ends (capacity only grows then),
    each tried as a full placement, up to ``SEARCH_LIMIT`` of them."""
    if duration is not None and math.isnan(duration):
        duration = None if gang.end is None else gang.end - gang.start
    start = gang.start if not_before is None else not_before
    units = gang.units()
    if len(units) == 1 and (len(units[0][1]) == 1 or not overlays(engine)):
        return engine.earliest_fit(units[0][0], duration, start)
    ends = sorted(
        {a.end for h in engine.snapshot().hosts for a in h.allocations if a.end is not None and a.end > start}
    )
    for t in [start, *ends][:SEARCH_LIMIT]:
        trial = place_gang(engine, gang.shifted(t, duration), earliest=False)
        if trial.ok:
            return EarliestFit(t, trial.hosts[gang.members[0].id])
    last = trial.results[-1] if trial.results else None
    return EarliestFit(None, None, dict(last.reasons) if last else {})
