"""One-shot functions over a snapshot, for callers that place once and throw the state away.

Contract: each call builds a `PlacementEngine` (O(allocations)) and answers; for many
decisions on one snapshot keep an engine instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from .engine import PlacementEngine
from .model import Cluster, Request
from .options import PlacementOptions
from .result import EarliestFit, MultiPlacementResult, PlacementResult


def place(cluster: Cluster, request: Request, options: PlacementOptions | None = None) -> PlacementResult:
    return PlacementEngine(cluster, options).place(request)


def place_many(
    cluster: Cluster,
    requests: Iterable[Request],
    all_or_nothing: bool = False,
    options: PlacementOptions | None = None,
) -> MultiPlacementResult:
    return PlacementEngine(cluster, options).place_many(list(requests), all_or_nothing)


def earliest_fit(
    cluster: Cluster,
    request: Request,
    duration: float | None,
    not_before: float,
    options: PlacementOptions | None = None,
) -> EarliestFit:
    """Earliest start >= ``not_before`` at which some host fits ``request`` for ``duration``."""
    return PlacementEngine(cluster, options).earliest_fit(request, duration, not_before)
