"""The placement core's input data: hosts, node groups, allocations, requests.

Contract: plain frozen dataclasses, no behaviour beyond small derived values. Times are
plain numbers (epoch seconds); a window is half-open ``[start, end)`` and ``end=None``
means open-ended. Loaders at the edge (Django rows, Ganeti files, simulation specs) build
these; the algorithms never see anything else.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .vectors import Resources

_NO_RATIOS: Mapping[str, float] = MappingProxyType({})


class HostState(enum.StrEnum):
    ONLINE = "online"  # takes new VMs
    DRAINED = "drained"  # keeps its VMs, takes no new ones
    OFFLINE = "offline"  # takes nothing, counts nothing


class AllocPolicy(enum.StrEnum):
    """Ganeti's node-group allocation policy."""

    PREFERRED = "preferred"
    LAST_RESORT = "last_resort"
    UNALLOCATABLE = "unallocatable"


class Policy(enum.StrEnum):
    BALANCED = "balanced"
    PACK = "pack"
    EXTERNAL = "external"


def window_end(end: float | None) -> float:
    return math.inf if end is None else end


@dataclass(frozen=True, slots=True)
class Allocation:
    """A VM's claim on a host over ``[start, end)``."""

    id: str
    resources: Resources
    start: float
    end: float | None = None
    anti_affinity: str | None = None
    tags: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"allocation {self.id}: end {self.end} <= start {self.start}")

    def overlaps(self, start: float, end: float | None) -> bool:
        return self.start < window_end(end) and start < window_end(self.end)


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """A set of hosts sharing an allocation policy and a default placement policy."""

    name: str
    alloc_policy: AllocPolicy = AllocPolicy.PREFERRED
    policy: Policy = Policy.BALANCED
    #: Program speaking Ganeti's IAllocator protocol, for ``policy=external``.
    iallocator: str | None = None
    tags: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Host:
    """A hypervisor and what it has promised.

    Usable capacity per resource is ``(total − reserved) × overcommit[resource]``
    (ratio 1.0 when absent). ``spindles`` only matters to the Ganeti bridge.
    """

    name: str
    total: Resources
    reserved: Resources = Resources()
    overcommit: Mapping[str, float] = field(default_factory=lambda: _NO_RATIOS, hash=False)
    state: HostState = HostState.ONLINE
    group: str = "default"
    hypervisor: str = "kvm"
    tags: frozenset[str] = frozenset()
    exclusive_storage: bool = False
    max_vms: int | None = None
    spindles: int = 1
    allocations: tuple[Allocation, ...] = ()
    #: Takes nothing that would still run after this moment (epoch seconds; None: no limit):
    #: a state change scheduled for when its current reservations end.
    available_until: float | None = None
    #: The overlay network the host is on (None: none): hosts of one overlay can carry a
    #: private network between them, so a gang's members that must be together may be
    #: spread over them (`placement.gang`).
    overlay: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.overcommit, MappingProxyType):
            object.__setattr__(self, "overcommit", MappingProxyType(dict(self.overcommit)))
        object.__setattr__(self, "state", HostState(self.state))

    def usable(self) -> Resources:
        def one(name: str) -> float:
            return max(0.0, (self.total.get(name) - self.reserved.get(name))) * (self.overcommit.get(name, 1.0))

        extras = {n: one(n) for n in set(self.total.extras) | set(self.reserved.extras)}
        return Resources(one("vcpus"), one("memory_mib"), one("disk_gib"), extras)


@dataclass(frozen=True, slots=True)
class Request:
    """What a new VM needs, and when.

    ``hypervisors``: acceptable hypervisor types (the image formats available), ``None`` =
    any. ``groups``: restrict to these node groups (Ganeti's ``group_name``), ``None`` = any.
    ``policy`` overrides the node groups' placement policy. ``gpus_any``: this many GPUs of
    one model, whichever model a host has (see `placement.devices`); N of a given model is
    the extra resource ``gpu:<model>`` instead.
    """

    resources: Resources
    start: float = 0.0
    end: float | None = None
    id: str = "request"
    hypervisors: frozenset[str] | None = None
    required_tags: frozenset[str] = frozenset()
    forbidden_tags: frozenset[str] = frozenset()
    anti_affinity: str | None = None
    policy: Policy | None = None
    exclusive_storage: bool = False
    groups: frozenset[str] | None = None
    tags: frozenset[str] = frozenset()
    gpus_any: int = 0
    #: How many VMs it stands for: members of a gang that share a host are placed as one
    #: request (`placement.gang`), which a host's ``max_vms`` must take whole.
    vms: int = 1
    #: Only on hosts of this overlay network (a gang's member spread over one).
    overlay: str | None = None

    def __post_init__(self) -> None:
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"request {self.id}: end {self.end} <= start {self.start}")
        if self.vms < 1:
            raise ValueError(f"request {self.id}: vms {self.vms} < 1")
        if self.gpus_any < 0:
            raise ValueError(f"request {self.id}: gpus_any {self.gpus_any} < 0")
        if self.policy is not None:
            object.__setattr__(self, "policy", Policy(self.policy))

    def as_allocation(self, start: float | None = None, end: float | None = None) -> Allocation:
        """The allocation this request becomes once placed (optionally re-timed)."""
        s = self.start if start is None else start
        e = self.end if start is None else end
        return Allocation(self.id, self.resources, s, e, self.anti_affinity, self.tags)

    def shifted(self, start: float, duration: float | None) -> Request:
        end = None if duration is None else start + duration
        return _replace(self, start=start, end=end)


def _replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


@dataclass(frozen=True, slots=True)
class Cluster:
    """A snapshot: hosts (with their allocations), node groups, and the time it was taken.

    ``now`` matters for speed only: open-ended allocations that started by ``now`` are kept
    as a per-host baseline instead of in the time index.
    """

    hosts: tuple[Host, ...]
    groups: tuple[NodeGroup, ...] = ()
    now: float = 0.0

    def group(self, name: str) -> NodeGroup:
        for g in self.groups:
            if g.name == name:
                return g
        return NodeGroup(name)
