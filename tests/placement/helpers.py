"""Builders and brute-force references for the placement tests.

The references recompute everything from the definitions (usage at every instant, every
host, every start time) with no indexes, so the engine's shortcuts are checked against
something obviously right.
"""

from __future__ import annotations

import math
import os
import shutil
import sys

import pytest

from placement import (
    Allocation,
    Cluster,
    Host,
    HostState,
    NodeGroup,
    Request,
    Resources,
)

R = Resources
GANETI_BIN = os.environ.get("GANETI_BIN", "/usr/lib/ganeti/3.0/usr/bin")
HAIL = os.environ.get("GANETI_HAIL", "/usr/lib/ganeti/3.0/usr/lib/ganeti/iallocators/hail")


def ganeti_tool(name: str) -> str:
    """Path of a Ganeti htools binary; a missing one fails the test (never skips it)."""
    path = HAIL if name == "hail" else os.path.join(GANETI_BIN, name)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        found = shutil.which(name)
        if found:
            return found
        pytest.fail(
            f"Ganeti's {name} is not installed at {path}: install the Debian package "
            "ganeti-htools-3.0 (the Makefile does) or set GANETI_BIN / GANETI_HAIL"
        )
    return path


def htools_command() -> str:
    """Path of our ``htools`` (pyproject's console script, beside the interpreter); a
    missing one fails the test: the project is installed into the venv by make."""
    path = os.path.join(os.path.dirname(sys.executable), "htools")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: run make install-dev (it installs the project's htools command)")
    return path


def host(name, vcpus=16, mem=65536, disk=1000, **kw) -> Host:
    return Host(name, R(vcpus, mem, disk), **kw)


def alloc(aid, vcpus=1, mem=1024, disk=10, start=0, end=None, **kw) -> Allocation:
    return Allocation(aid, R(vcpus, mem, disk), start, end, **kw)


def request(vcpus=1, mem=1024, disk=10, start=0, end=None, rid="r", **kw) -> Request:
    return Request(R(vcpus, mem, disk), start, end, rid, **kw)


def cluster(*hosts, groups=(), now=0) -> Cluster:
    return Cluster(tuple(hosts), tuple(groups), now)


def group(name, alloc_policy="preferred", policy="balanced", **kw) -> NodeGroup:
    return NodeGroup(name, alloc_policy, policy, **kw)


# ------------------------------------------------------------------ references

NAMES = ("vcpus", "memory_mib", "disk_gib")


def capacity(h: Host, name: str) -> float:
    return max(0.0, h.total.get(name) - h.reserved.get(name)) * h.overcommit.get(name, 1.0)


def usage_at(h: Host, t: float, name: str) -> float:
    total = 0.0
    for a in h.allocations:
        if a.start <= t < (math.inf if a.end is None else a.end):
            total += a.resources.get(name) if name != "vms" else 1
    return total


def window_instants(h: Host, start: float, end: float | None) -> list[float]:
    """Every instant where usage can change inside [start, end), plus start."""
    stop = math.inf if end is None else end
    points = {start}
    for a in h.allocations:
        for t in (a.start, a.end):
            if t is not None and start <= t < stop:
                points.add(t)
    return sorted(points)


def peak(h: Host, start: float, end: float | None, name: str) -> float:
    return max(usage_at(h, t, name) for t in window_instants(h, start, end))


def statically_ok(c: Cluster, h: Host, r: Request) -> bool:
    g = c.group(h.group)
    return (
        h.state == HostState.ONLINE
        and str(g.alloc_policy) != "unallocatable"
        and (r.groups is None or h.group in r.groups)
        and (r.hypervisors is None or h.hypervisor in r.hypervisors)
        and r.required_tags <= h.tags
        and not (r.forbidden_tags & h.tags)
        and (not r.exclusive_storage or h.exclusive_storage)
    )


def fits(h: Host, r: Request, start: float | None = None, end=...) -> bool:
    s = r.start if start is None else start
    e = r.end if end is ... else end
    stop = math.inf if e is None else e
    if r.anti_affinity and any(
        a.anti_affinity == r.anti_affinity and a.start < stop and s < (math.inf if a.end is None else a.end)
        for a in h.allocations
    ):
        return False
    names = set(NAMES) | set(r.resources.extras) | set(h.total.extras)
    for name in names:
        need = r.resources.get(name)
        if need and peak(h, s, e, name) + need > capacity(h, name) + 1e-9:
            return False
    if h.max_vms is not None and peak(h, s, e, "vms") + 1 > h.max_vms:
        return False
    return True


def feasible_hosts(c: Cluster, r: Request) -> list[Host]:
    return [h for h in c.hosts if statically_ok(c, h, r) and fits(h, r)]


def scored_names(c: Cluster) -> list[str]:
    names = set(NAMES)
    for h in c.hosts:
        names |= set(h.total.extras)
    return [
        n
        for n in sorted(names, key=lambda n: (n not in NAMES, NAMES.index(n) if n in NAMES else 0, n))
        if any(0 < capacity(h, n) < math.inf for h in c.hosts)
    ]


def utilisation(h: Host, names, start, end) -> list[float]:
    out = []
    for n in names:
        cap = capacity(h, n)
        out.append(peak(h, start, end, n) / cap if 0 < cap < math.inf else 0.0)
    return out


def balanced_scores(c: Cluster, r: Request) -> dict[str, float]:
    """Score of placing ``r`` on each feasible host, straight from the definition."""
    names = scored_names(c)
    online = [h for h in c.hosts if h.state == HostState.ONLINE]
    base = {h.name: utilisation(h, names, r.start, r.end) for h in online}
    out = {}
    for h in feasible_hosts(c, r):
        total = 0.0
        for k, n in enumerate(names):
            cap = capacity(h, n)
            d = r.resources.get(n) / cap if 0 < cap < math.inf else 0.0
            values = [base[o.name][k] + (d if o.name == h.name else 0.0) for o in online]
            mean = sum(values) / len(values)
            total += math.sqrt(max(0.0, sum((v - mean) ** 2 for v in values) / len(values)))
        out[h.name] = total
    return out


def pack_scores(c: Cluster, r: Request) -> dict[str, float]:
    names = scored_names(c)
    out = {}
    for h in feasible_hosts(c, r):
        util = utilisation(h, names, r.start, r.end)
        total = 0.0
        for k, n in enumerate(names):
            cap = capacity(h, n)
            d = r.resources.get(n) / cap if 0 < cap < math.inf else 0.0
            total += 1.0 - util[k] - d
        out[h.name] = total
    return out


def brute_earliest(c: Cluster, r: Request, duration, not_before, horizon):
    """Scan every integer start from ``not_before`` to ``horizon``."""
    for t in range(int(not_before), int(horizon) + 1):
        end = None if duration is None else t + duration
        for h in c.hosts:
            if statically_ok(c, h, r) and fits(h, r, t, end):
                return t
    return None


def never_overcommitted(c: Cluster) -> bool:
    for h in c.hosts:
        names = set(NAMES) | set(h.total.extras)
        instants = {a.start for a in h.allocations} | {a.end for a in h.allocations if a.end is not None}
        for t in instants:
            for n in names:
                if usage_at(h, t, n) > capacity(h, n) + 1e-9:
                    return False
            if h.max_vms is not None and usage_at(h, t, "vms") > h.max_vms:
                return False
    return True


__all__ = [
    "GANETI_BIN",
    "HAIL",
    "R",
    "alloc",
    "balanced_scores",
    "brute_earliest",
    "cluster",
    "feasible_hosts",
    "fits",
    "ganeti_tool",
    "group",
    "host",
    "never_overcommitted",
    "pack_scores",
    "request",
]
