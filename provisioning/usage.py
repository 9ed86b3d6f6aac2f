"""Uses: what held a machine for someone over time, from every kind of holder, for showback
(``reservations.showback`` sums them per day, user, class, group and image).

A ``Use`` is one machine held for one user over ``[start, end)`` with its size. Each kind that
holds machines registers in ``SOURCES`` a function ``fn(t0, t1, now)`` yielding its uses that
overlap ``[t0, t1)``: the ad-hoc VMs here (``vm_uses``), batch runs from the runs app; the
reservations' own uses are read by ``reservations.showback`` itself (it shares their intervals
with the usage report). Declared here, below both, as the quota engine's ``HOLDERS`` are.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from core.hooks import Hook


@dataclass(frozen=True)
class Use:
    """One machine held for someone over ``[start, end)``. ``group`` None: the user's first
    group (``reservations.usage``'s rule); ``class_id``: the class of a class session's seat."""

    kind: str
    user_id: int | None
    image: str
    start: datetime
    end: datetime
    vcpus: int
    memory_mib: int
    gpus: int = 0
    group: str | None = None
    class_id: int | None = None
    class_name: str = ""


SOURCES: Hook[Callable[[datetime, datetime, datetime], Iterable[Use]]] = Hook("provisioning.usage.SOURCES")


def vm_uses(t0, t1, now):
    """Ad-hoc VMs (``VM.adhoc``: on no reservation's or run's claim) that held a claim in
    ``[t0, t1)``: from the claim's start to its release (``now`` while held; the VM's last change
    when destroyed with its claim gone). One never placed or failed to build held nothing."""
    from provisioning.models import VM

    rows = (
        VM.objects.filter(adhoc=True, created__lt=t1)
        .exclude(state__in=(VM.State.REQUESTED, VM.State.FAILED))
        .exclude(state=VM.State.DESTROYED, updated__lt=t0)
        .order_by()
        .values_list(
            "owner_id",
            "image__name",
            "vcpus",
            "memory_mib",
            "state",
            "created",
            "updated",
            "allocation__start",
            "allocation__released",
            "allocation__extras",
        )
    )
    for owner, image, vcpus, memory_mib, state, created, updated, start, released, extras in rows:
        if released is None:
            released = updated if state == VM.State.DESTROYED else now
        gpus = sum(int(n) for name, n in (extras or {}).items() if name.startswith("gpu:"))
        yield Use("vm", owner, image, max(created, start or created), min(released, now), vcpus, memory_mib, gpus)
