"""Resource vectors: vCPUs, memory (MiB), disk (GiB) and any named extras.

Contract: `Resources` is an immutable value with element-wise arithmetic. The engine
turns it into a plain tuple over a fixed `ResourceSpace` (one slot per resource name)
so the hot loops index lists instead of looking up attributes and dict keys.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

CORE_NAMES = ("vcpus", "memory_mib", "disk_gib")
#: A pseudo-resource counting VMs, so `max_vms` is checked by the same code as memory.
VMS = "vms"

_EMPTY: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of every resource; extras are named (``{"gpu": 1}``)."""

    vcpus: float = 0
    memory_mib: float = 0
    disk_gib: float = 0
    extras: Mapping[str, float] = field(default_factory=lambda: _EMPTY, hash=False)

    def __post_init__(self) -> None:
        # Freeze extras so a Resources can be shared between hosts and requests safely.
        extras = self.extras
        if not isinstance(extras, MappingProxyType):
            object.__setattr__(self, "extras", MappingProxyType(dict(extras)))

    def get(self, name: str) -> float:
        if name == "vcpus":
            return self.vcpus
        if name == "memory_mib":
            return self.memory_mib
        if name == "disk_gib":
            return self.disk_gib
        return self.extras.get(name, 0)

    def names(self) -> tuple[str, ...]:
        return CORE_NAMES + tuple(sorted(self.extras))

    def as_dict(self) -> dict[str, float]:
        out = {"vcpus": self.vcpus, "memory_mib": self.memory_mib, "disk_gib": self.disk_gib}
        out.update(self.extras)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> Resources:
        extras = {k: v for k, v in data.items() if k not in CORE_NAMES}
        return cls(data.get("vcpus", 0), data.get("memory_mib", 0), data.get("disk_gib", 0), extras)

    def __add__(self, other: Resources) -> Resources:
        return _combine(self, other, lambda a, b: a + b)

    def __sub__(self, other: Resources) -> Resources:
        return _combine(self, other, lambda a, b: a - b)

    def scaled(self, factor: float) -> Resources:
        return Resources(
            self.vcpus * factor,
            self.memory_mib * factor,
            self.disk_gib * factor,
            {k: v * factor for k, v in self.extras.items()},
        )

    def fits_in(self, other: Resources) -> bool:
        return all(self.get(n) <= other.get(n) for n in set(self.names()) | set(other.names()))


def _combine(a: Resources, b: Resources, op) -> Resources:
    names = set(a.extras) | set(b.extras)
    return Resources(
        op(a.vcpus, b.vcpus),
        op(a.memory_mib, b.memory_mib),
        op(a.disk_gib, b.disk_gib),
        {n: op(a.extras.get(n, 0), b.extras.get(n, 0)) for n in names},
    )


class ResourceSpace:
    """The fixed order of resource slots used by one engine.

    Slots: the three core resources, the extras seen anywhere in the cluster or the
    request, then the VM-count pseudo-resource (scored never, checked always).
    """

    __slots__ = ("names", "index", "scored", "vms_slot")

    def __init__(self, extras: Iterable[str] = ()) -> None:
        extra_names = tuple(sorted(set(extras) - set(CORE_NAMES) - {VMS}))
        self.names: tuple[str, ...] = CORE_NAMES + extra_names + (VMS,)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.vms_slot = len(self.names) - 1
        self.scored = tuple(range(self.vms_slot))

    def __len__(self) -> int:
        return len(self.names)

    def vector(self, amount: Resources, vms: float = 0) -> tuple[float, ...]:
        """`amount` as a tuple over this space; unknown extras raise KeyError."""
        for name in amount.extras:
            if name not in self.index:
                raise KeyError(f"resource {name!r} is not in this resource space")
        values = [amount.get(name) for name in self.names[:-1]]
        values.append(vms)
        return tuple(values)

    def resources(self, vector: Iterable[float]) -> Resources:
        values = list(vector)
        extras = {name: values[i] for i, name in enumerate(self.names[3:-1], start=3) if values[i]}
        return Resources(values[0], values[1], values[2], extras)

    def knows(self, amount: Resources) -> bool:
        return all(name in self.index for name in amount.extras)


def capacity_vector(
    space: ResourceSpace,
    total: Resources,
    reserved: Resources,
    overcommit: Mapping[str, float],
    max_vms: int | None,
) -> tuple[float, ...]:
    """Usable capacity per slot: (total − reserved) × overcommit ratio, never negative."""
    values = []
    for name in space.names[:-1]:
        usable = (total.get(name) - reserved.get(name)) * overcommit.get(name, 1.0)
        values.append(max(0.0, usable))
    values.append(math.inf if max_vms is None else float(max_vms))
    return tuple(values)
