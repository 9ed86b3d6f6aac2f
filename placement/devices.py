"""GPUs (and other counted PCI devices) as resources, one per model.

Contract: a host's devices of one model are the named extra resource ``gpu:<model>``
(``{"gpu:nvidia-a100": 2}``), so they are counted over time, checked, explained and planned
for by the same code as memory: nothing here runs for a request that asks for no GPU.

A request asks either for N of one model (the extra ``gpu:<model>`` in its resources) or for
N of *any one* model (``Request.gpus_any``): the engine then tries each model the cluster has
as a concrete request and keeps the best, and the placed request names the model, so the
allocation it becomes counts against that model only. A VM's GPUs are of one model (the
devices passed through to a guest are meant to be alike).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from .model import Request
from .result import format_time
from .vectors import Resources

PREFIX = "gpu:"


def gpu(model: str) -> str:
    """The resource name of one GPU model: ``gpu:nvidia-a100``."""
    return f"{PREFIX}{model}"


def gpus(counts: Mapping[str, float]) -> dict[str, float]:
    """Model → count as extras: ``{"nvidia-t4": 4}`` → ``{"gpu:nvidia-t4": 4}``."""
    return {gpu(model): n for model, n in counts.items() if n}


def model_of(name: str) -> str | None:
    """The model of a GPU resource name, None for any other resource."""
    return name[len(PREFIX) :] if name.startswith(PREFIX) else None


def models(names: Iterable[str]) -> list[str]:
    """The GPU models among resource names, sorted."""
    return sorted(m for m in map(model_of, names) if m)


def concrete(request: Request, model: str) -> Request:
    """An any-model request as a request for ``gpus_any`` devices of ``model``."""
    extra = Resources(extras={gpu(model): request.gpus_any})
    return dataclasses.replace(request, resources=request.resources + extra, gpus_any=0)


def asked(request: Request) -> dict[str, float]:
    """The GPU resources a (concrete) request asks for, name → count."""
    return {n: v for n, v in request.resources.extras.items() if v and n.startswith(PREFIX)}


def shortage_note(state, request: Request, hosts: Iterable[int]) -> str:
    """What a refusal of GPUs means in words: per model asked, the most that any of ``hosts``
    (those passing the static checks) has free over the whole window, e.g. ``needs 2 GPUs
    nvidia-a100 from 2026-12-01 10:00 to 12:00, at most 1 free (on h3)``."""
    hosts = list(hosts)
    parts = []
    for name, need in sorted(asked(request).items()):
        slot_index = state.space.index.get(name)
        label = f"{_count(need)} GPU{'s' if need != 1 else ''} {model_of(name)}"
        if slot_index is None:
            parts.append(f"needs {label}: no host has that model")
            continue
        best, where = -1.0, None
        for idx in hosts:
            slot = state.slots[idx]
            cap = slot.capacity[slot_index]
            if not cap:
                continue
            free = cap - slot.timeline.peak(request.start, _end(request))[slot_index]
            if free > best:
                best, where = free, slot.name
        if where is None:
            parts.append(f"needs {label}: no eligible host has that model")
        elif best < need:
            parts.append(f"needs {label} {_span(request)}, at most {_count(max(best, 0.0))} free (on {where})")
    return "; ".join(parts)


def _end(request: Request) -> float:
    return math.inf if request.end is None else request.end


def _span(request: Request) -> str:
    if request.end is None:
        return f"from {format_time(request.start)} on"
    return f"from {format_time(request.start)} to {format_time(request.end)}"


def _count(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else f"{n:g}"
