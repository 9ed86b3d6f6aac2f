"""Suspend instead of preempt, on the capacity side: the ladder of priority classes, who holds
claims that may be suspended, and the plan of which to suspend (the pure core's ``preempt``).

A demand of some class (``Demand.rank``) that fits nowhere may still fit once claims of a lower
class are suspended: their VMs' memory saved to disk, their CPU and memory given back, their
disk still claimed. What holds such claims (batch runs, a layer above) registers a ``Holder``
in ``HOLDERS`` in its ``AppConfig.ready()``:

- ``candidates()`` → ``[(allocation id, host id, class)]``: the claims it would suspend now;
- ``suspend(allocation ids, *, actor, reason)`` → the ids of the jobs after whose end their
  VMs are suspended (or gone). It is called inside the claiming transaction and must, in it,
  replace each claim by a disk-only one (``claim_disk``) and ask for the suspension, or raise
  ``Gone`` when one of them can no longer be suspended (the claim is then tried again).

Only registered holders' claims are ever candidates: a reservation's claim never is, so a
machine a person is using is never suspended.
"""

from collections.abc import Callable
from dataclasses import dataclass

from core.hooks import Hook
from placement import preempt

RANKS = {"low": 1, "batch": 2, "high": 3}  # runs' classes; reservations take one (RESERVATION_PRIORITY)


class Gone(Exception):
    """A claim planned for suspension cannot be suspended any more (its holder ended, or is
    already being suspended): plan again."""


@dataclass(frozen=True)
class Holder:
    candidates: Callable
    suspend: Callable
    noun: str = "run"


HOLDERS: Hook[Holder] = Hook("capacity.preemption.HOLDERS")


@dataclass(frozen=True)
class Found:
    """A preemption on a host: the core's answer, the host's id, the holder of each victim."""

    plan: preempt.Preemption
    host_id: int
    holders: dict

    def note(self):
        return self.plan.note()


def rank(name):
    """The rank of a class name (None: it suspends nothing)."""
    return RANKS.get(name) if name else None


def candidates():
    """``[(host id, Preemptible, holder)]`` of every registered holder."""
    found = []
    for holder in HOLDERS:
        for allocation_id, host_id, klass in holder.candidates():
            victim = preempt.Preemptible(str(allocation_id), RANKS[klass], f"{klass} {holder.noun}")
            found.append((host_id, victim, holder))
    return found


def suspend(found, *, actor, reason):
    """Ask each victim's holder to suspend it (inside the caller's transaction); the job ids to wait for."""
    jobs = []
    for holder in HOLDERS:
        ids = [int(v.allocation) for v in found.plan.victims if found.holders[v.allocation] is holder]
        if ids:
            jobs.extend(holder.suspend(ids, actor=actor, reason=reason))
    return jobs
