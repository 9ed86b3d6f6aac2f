"""`PlacementEngine`: place requests on a cluster snapshot, explain refusals, plan ahead.

Contract: build an engine from a `Cluster` once, then call `place` (decide, do not record),
`commit` (record a decision), `place_many` (N at once, optionally all-or-nothing) and
`earliest_fit`. A decision is made in tiers: hosts of *preferred* node groups first, hosts
of *last-resort* groups only when no preferred host fits, *unallocatable* groups never.
Within a tier each host is scored by its node group's policy (or the request's override).
When one tier mixes policies, they are tried in the order their first host appears in the
snapshot and the first policy that finds a host decides (scores of different policies are
not comparable).

The engine is not thread-safe; give each worker its own (they are cheap to rebuild from a
snapshot and hold no connections).
"""

from __future__ import annotations

import dataclasses
import math

from . import devices, refusals
from .earliest import earliest_fit as _earliest_fit
from .explain import explain, tag_note, unknown_resources
from .filters import StaticView, static_view
from .model import Allocation, Cluster, Policy, Request, window_end
from .options import PlacementOptions
from .result import EarliestFit, MultiPlacementResult, PlacementResult
from .search import Choice, Window, best_host, evaluate
from .state import ClusterState


class PlacementEngine:
    def __init__(self, cluster: Cluster, options: PlacementOptions | None = None) -> None:
        self.state = ClusterState(cluster, options)
        self.options = self.state.options

    # ------------------------------------------------------------------ deciding

    def place(self, request: Request) -> PlacementResult:
        if request.gpus_any:
            return self._place_any_gpu(request)
        view = static_view(self.state, request)
        missing = unknown_resources(self.state, request)
        if missing:
            return self._unknown_resource(request, view, missing)
        window = self._window(request)
        notes = []
        for tier in view.tiers:
            if not tier:
                continue
            choice, policy, note = self._choose(request, window, tier)
            if choice is not None:
                return self._success(request, window, view, tier, choice, policy, note)
            if note:
                notes.append(note)
        return self._failure(request, window, view, "; ".join(notes))

    def _place_any_gpu(self, request: Request) -> PlacementResult:
        """N GPUs of any one model: each model the cluster has, as a concrete request; the
        best score wins (ties: the first model by name). Refused: the refusal of the model
        whose earliest fit comes first, its note naming every model tried."""
        names = devices.models(self.state.space.names)
        if not names:
            view = static_view(self.state, request)
            return self._unknown_resource(request, view, [f"{devices.PREFIX}any"])
        results = [self.place(devices.concrete(request, model)) for model in names]
        placed = [r for r in results if r.ok]
        if placed:
            return min(placed, key=lambda r: r.score if r.score is not None else math.inf)
        refused = min(results, key=lambda r: _fit_start(r.earliest_fit))
        tried = f"any GPU model: tried {', '.join(names)}"
        return dataclasses.replace(refused, note="; ".join(n for n in (refused.note, tried) if n))

    def _window(self, request: Request) -> Window:
        state = self.state
        start, end = request.start, window_end(request.end)
        return Window(
            start,
            end,
            state.space.vector(request.resources, vms=request.vms),
            state.window_entries(start, end),
            state.anti_affinity_hosts(request.anti_affinity, start, end),
        )

    def _choose(self, request, window, tier) -> tuple[Choice | None, Policy | None, str]:
        notes = []
        for policy, hosts in tier.items():
            if policy == Policy.EXTERNAL:
                from .ganeti.external import choose_external

                choice, note = choose_external(self, request, window, hosts)
                notes.append(note)
            else:
                choice = best_host(self.state, window, hosts, policy)
            if choice is not None:
                return choice, policy, "; ".join(n for n in notes if n)
        return None, None, "; ".join(n for n in notes if n)

    def _success(self, request, window, view, tier, choice, policy, note) -> PlacementResult:
        slot = self.state.slots[choice.host]
        counts: dict[str, int] = {}
        if self.options.explain:
            counts, _ = explain(self.state, request, window, view, 0)
        return PlacementResult(
            request,
            slot.name,
            policy=str(policy),
            group=slot.host.group,
            score=choice.score,
            reasons=counts,
            candidates=sum(len(h) for h in tier.values()),
            note=note,
        )

    def _failure(self, request: Request, window: Window, view: StaticView, note: str = "") -> PlacementResult:
        counts, misses = explain(self.state, request, window, view, self.options.closest_misses)
        if counts.get(refusals.MISSING_TAG):
            note = "; ".join(n for n in (note, tag_note(self.state, request)) if n)
        if devices.asked(request):
            short = devices.shortage_note(self.state, request, view.eligible())
            note = "; ".join(n for n in (note, short) if n)
        fit = None
        external = [i for tier in view.tiers for i in tier.get(Policy.EXTERNAL, ())]
        if external:
            # Hosts our checks accept but the program did not (or could not) choose.
            refused = sum(1 for i in external if evaluate(self.state, window, i, Policy.PACK) is not None)
            if refused:
                counts[refusals.EXTERNAL_REFUSED] = refused
            # Our earliest fit knows capacity, not the external program's rules: it could
            # only give a false "yes".
            note = "; ".join(n for n in (note, "no earliest fit: an external allocator decides") if n)
        elif self.options.earliest_fit:
            fit = self.earliest_fit(request)
        return PlacementResult(request, None, reasons=counts, closest_misses=misses, earliest_fit=fit, note=note)

    def _unknown_resource(self, request, view, missing) -> PlacementResult:
        counts = dict(view.counts)
        eligible = len(view.eligible())
        if eligible:
            code = refusals.lacks(missing[0])
            counts[code] = counts.get(code, 0) + eligible
        return PlacementResult(
            request,
            None,
            reasons=counts,
            earliest_fit=EarliestFit(None, None, counts),
            note=f"no host has {', '.join(missing)}",
        )

    # ------------------------------------------------------------------ recording

    def commit(self, result: PlacementResult) -> Allocation:
        """Record a successful decision as an allocation on its host."""
        if result.host is None:
            raise ValueError(f"cannot commit a refusal: {result}")
        alloc = result.request.as_allocation()
        self.state.add(result.host, alloc)
        return alloc

    def add_allocation(self, host: str, allocation: Allocation) -> None:
        self.state.add(host, allocation)

    def remove_allocation(self, allocation_id: str) -> Allocation:
        return self.state.remove(allocation_id)

    def snapshot(self) -> Cluster:
        return self.state.snapshot()

    def warm(self) -> None:
        """Build every host's timeline now rather than on first use (steadier latency for
        a long-lived engine; costs about a second per 100,000 allocations)."""
        self.state.warm()

    # ------------------------------------------------------------------ many at once

    def place_many(self, requests, all_or_nothing: bool = False, commit: bool = False) -> MultiPlacementResult:
        """Place requests in order, each seeing the ones before it.

        With ``all_or_nothing`` the first refusal undoes every placement and the rest are
        not tried. Without ``commit`` nothing stays recorded afterwards (a plan).
        """
        results: list[PlacementResult] = []
        recorded: list[str] = []
        failed = False
        for request in requests:
            if failed and all_or_nothing:
                results.append(PlacementResult(request, None, note="not tried: an earlier request failed"))
                continue
            result = self.place(request)
            results.append(result)
            if result.ok:
                recorded.append(self.commit(result).id)
            else:
                failed = True
        if (failed and all_or_nothing) or not commit:
            for alloc_id in reversed(recorded):
                self.state.remove(alloc_id)
        return MultiPlacementResult(tuple(results), all_or_nothing)

    # ------------------------------------------------------------------ planning

    def earliest_fit(
        self,
        request: Request,
        duration: float | None = math.nan,
        not_before: float | None = None,
    ) -> EarliestFit:
        """Earliest start >= ``not_before`` (default: the request's start) that fits.

        ``duration`` defaults to the request's own (None when it is open-ended).
        """
        if duration is not None and math.isnan(duration):
            duration = None if request.end is None else request.end - request.start
        start = request.start if not_before is None else not_before
        if request.gpus_any:
            names = devices.models(self.state.space.names)
            fits = [self.earliest_fit(devices.concrete(request, m), duration, start) for m in names]
            found = [f for f in fits if f.found]
            if found:
                return min(found, key=lambda f: f.start)
            if fits:
                return fits[0]
            return self._unknown_resource(
                request, static_view(self.state, request), [f"{devices.PREFIX}any"]
            ).earliest_fit
        return _earliest_fit(self.state, request, duration, start, self.options.earliest_fit_horizon)


def _fit_start(fit: EarliestFit | None) -> float:
    return math.inf if fit is None or fit.start is None else fit.start
