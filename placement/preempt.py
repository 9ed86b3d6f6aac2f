"""Suspend instead of preempt: which lower-class claims, suspended, would make room.

Contract: pure data in, a ``Preemption`` (or None) out. A request of class ``rank`` may free
room on a host by suspending claims of a strictly lower class (``Preemptible``: a claim's id in
the cluster, its class's rank and a label such as ``batch run``). A suspended claim keeps its
disk and gives back everything else (its VM's memory is saved to that disk). Every hard check
still applies: each candidate host is tried with the same engine on a one-host cluster, its
suspended claims shrunk to their disk. Per host the cheapest set is taken greedily — lowest
class first, then the biggest — and then pruned of any claim it does not need; the host needing
the fewest suspensions wins (then the lowest classes, then the name), so the answer is
deterministic. Hosts without candidates are not looked at: a refusal has been computed already.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from .engine import PlacementEngine
from .model import Allocation, Cluster, Host, Policy, Request
from .options import PlacementOptions
from .vectors import Resources

NOTE = "fits if "  # how a preemption's note begins


@dataclass(frozen=True, slots=True)
class Preemptible:
    """A claim that may be suspended for a request of a higher class."""

    allocation: str
    rank: int
    label: str = "run"


@dataclass(frozen=True, slots=True)
class Preemption:
    """On ``host``, the request fits once ``victims`` are suspended."""

    host: str
    victims: tuple[Preemptible, ...]

    def what(self) -> str:
        """``2 batch runs`` (``1 low run and 1 batch run`` when mixed)."""
        counts = Counter(v.label for v in self.victims)
        order = {v.label: (v.rank, v.label) for v in self.victims}
        ordered = sorted(counts.items(), key=lambda item: order[item[0]])
        parts = [f"{n} {label}{'s' if n != 1 else ''}" for label, n in ordered]
        return " and ".join(parts)

    def note(self) -> str:
        """``fits if 2 batch runs are suspended``."""
        return f"{NOTE}{self.what()} {'is' if len(self.victims) == 1 else 'are'} suspended"

    def to_dict(self) -> dict:
        return {"host": self.host, "suspend": [v.allocation for v in self.victims], "note": self.note()}


def disk_only(allocation: Allocation) -> Allocation:
    """What a suspended claim still holds: its disk."""
    return replace(allocation, resources=Resources(0, 0, allocation.resources.disk_gib))


def nothing(allocation: Allocation) -> Allocation:
    """What a claim that yields still holds once its VM is destroyed (a warm VM's): nothing."""
    return replace(allocation, resources=Resources(0, 0, 0))


def plan(
    cluster: Cluster, request: Request, rank: int, candidates, options: PlacementOptions | None = None, shrink=disk_only
) -> Preemption | None:
    """The fewest claims of a class below ``rank`` whose suspension lets ``request`` fit, or None.
    ``shrink``: what a victim still holds (``disk_only``: suspended; ``nothing``: destroyed)."""
    lower = {c.allocation: c for c in candidates if c.rank < rank}
    if not lower:
        return None
    options = options or PlacementOptions(earliest_fit=False)
    request = replace(request, policy=Policy.BALANCED)  # one host: capacity only, no external program
    best = None
    for host in cluster.hosts:
        found = _on_host(cluster, host, request, lower, options, shrink)
        if found is not None and (best is None or _cost(found) < _cost(best)):
            best = found
    return best


def _cost(preemption: Preemption):
    return len(preemption.victims), sorted(v.rank for v in preemption.victims), preemption.host


def _on_host(cluster, host, request, lower, options, shrink):
    mine = [a for a in host.allocations if a.id in lower]
    if not mine:
        return None
    order = sorted(mine, key=lambda a: (lower[a.id].rank, -a.resources.memory_mib, -a.resources.vcpus, a.id))
    chosen = []
    for allocation in order:
        chosen.append(allocation.id)
        if _fits(cluster, host, request, set(chosen), options, shrink):
            break
    else:
        return None
    for victim in sorted(chosen, key=lambda i: (-lower[i].rank, i)):  # drop what is not needed
        rest = set(chosen) - {victim}
        if rest and _fits(cluster, host, request, rest, options, shrink):
            chosen.remove(victim)
    victims = tuple(sorted((lower[i] for i in chosen), key=lambda v: (v.rank, v.allocation)))
    return Preemption(host.name, victims)


def _fits(cluster: Cluster, host: Host, request: Request, suspended: set, options: PlacementOptions, shrink) -> bool:
    allocations = tuple(shrink(a) if a.id in suspended else a for a in host.allocations)
    one = replace(cluster, hosts=(replace(host, allocations=allocations),))
    return PlacementEngine(one, options).place(request).ok
