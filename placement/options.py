"""The one explicit record of knobs the placement algorithms read.

Contract: algorithms take a `PlacementOptions`; nothing reads Django settings or the
environment. The Django layer builds this record from its settings at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Policy


@dataclass(frozen=True, slots=True)
class PlacementOptions:
    #: Policy for hosts whose node group is not declared in the cluster snapshot.
    default_policy: Policy = Policy.BALANCED
    #: Count rejection reasons also when a host was found (always done when none is).
    explain: bool = False
    #: How many near-miss hosts to report when nothing fits.
    closest_misses: int = 3
    #: On failure, search for the earliest start at which the request would fit.
    earliest_fit: bool = True
    #: Give up the earliest-fit search after this many seconds past the request's start.
    earliest_fit_horizon: float | None = None
    #: IAllocator program for the external policy when the node group names none.
    iallocator: str | None = None
    #: Seconds an external allocator may run.
    external_timeout: float = 60.0
    #: Time-index bucket width in seconds; None picks one from the allocations' durations.
    bucket_seconds: float | None = None
