"""The checks that do not depend on time: state, node group, hypervisor, tags, storage, overlay.

Contract: `static_view(state, request)` returns, per host, the first static check it fails
(or None) and the passing hosts split into the preferred and last-resort tiers and by
placement policy. The view depends only on the request's static fields, so it is cached
on the engine state (host attributes never change within one engine).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from . import refusals
from .model import AllocPolicy, HostState, Policy, Request
from .state import ClusterState, HostSlot


def static_reason(state: ClusterState, slot: HostSlot, request: Request) -> str | None:
    host = slot.host
    if host.state == HostState.OFFLINE:
        return refusals.OFFLINE
    if host.state == HostState.DRAINED:
        return refusals.DRAINED
    if host.available_until is not None and (request.end is None or request.end > host.available_until):
        return refusals.RETIRING
    if state.groups[host.group].alloc_policy == AllocPolicy.UNALLOCATABLE:
        return refusals.GROUP_UNALLOCATABLE
    if request.groups is not None and host.group not in request.groups:
        return refusals.NOT_IN_GROUP
    if request.hypervisors is not None and host.hypervisor not in request.hypervisors:
        return refusals.WRONG_HYPERVISOR
    if not request.required_tags <= host.tags:
        return refusals.MISSING_TAG
    if request.forbidden_tags & host.tags:
        return refusals.FORBIDDEN_TAG
    if request.exclusive_storage and not host.exclusive_storage:
        return refusals.EXCLUSIVE_STORAGE
    if request.overlay is not None and host.overlay != request.overlay:
        return refusals.OFF_OVERLAY
    return None


@dataclass(frozen=True, slots=True)
class StaticView:
    #: Per host index: the first static check failed, or None.
    reason: tuple[str | None, ...]
    #: Hosts passing, per tier (0 = preferred groups, 1 = last-resort groups) and policy.
    tiers: tuple[dict[Policy, tuple[int, ...]], dict[Policy, tuple[int, ...]]]
    counts: dict[str, int]

    def eligible(self) -> list[int]:
        return [i for tier in self.tiers for hosts in tier.values() for i in hosts]


def static_view(state: ClusterState, request: Request) -> StaticView:
    key = (
        request.hypervisors,
        request.required_tags,
        request.forbidden_tags,
        request.exclusive_storage,
        request.groups,
        request.policy,
        request.overlay,
        # only a cluster with a host leaving service makes the view depend on the window's end
        request.end if state.retiring else None,
    )
    cached = state.static_cache.get(key)
    if cached is not None:
        return cached  # type: ignore[return-value]
    reason_list: list[str | None] = []
    tiers: tuple[dict[Policy, list[int]], dict[Policy, list[int]]] = ({}, {})
    for slot in state.slots:
        why = static_reason(state, slot, request)
        reason_list.append(why)
        if why is not None:
            continue
        group = state.groups[slot.host.group]
        tier = 1 if group.alloc_policy == AllocPolicy.LAST_RESORT else 0
        policy = request.policy or group.policy
        tiers[tier].setdefault(policy, []).append(slot.idx)
    view = StaticView(
        tuple(reason_list),
        tuple({p: tuple(h) for p, h in tier.items()} for tier in tiers),  # type: ignore[arg-type]
        dict(Counter(r for r in reason_list if r is not None)),
    )
    state.static_cache[key] = view
    return view
