"""Our hosts as Ganeti sees them: a `Cluster` at one moment → the htools model.

Contract: `to_ganeti(cluster, at)` builds a `GCluster` of the cluster as it stands at time
``at`` (every allocation active then becomes a running instance), so hspace, hbal and
hsqueeze can answer for that moment. With ``hold_future=True`` (hbal and hsqueeze plan
moves that must hold from then on) each host also carries one pinned ``plain`` instance
sized at the peak of its allocations that start later, per resource: Ganeti never moves a
plain instance nor empties a node that has one, so no move can land where a future
reservation would no longer fit, and no host with one is powered off. `iallocator_request(...)` builds the IAllocator
request an external allocator (e.g. Ganeti's hail) gets for one placement over a window.

Where the models differ, the bridge says how:

- Ganeti charges vCPUs as ``(os_vcpus + Σ vcpus) / cores ≤ vcpu_ratio`` per node group;
  we use ``Σ vcpus ≤ (cores − reserved) × ratio`` per host. A node group gets the largest
  vCPU ratio of its hosts; our own checks re-validate whatever an external program picks.
- Ganeti has no memory over-commit; memory ratios above 1 are not represented.
- Drained and offline hosts are offline to Ganeti (htools treats drained as offline).
- Disk is MiB in Ganeti and GiB here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..model import AllocPolicy, Cluster, Host, HostState, Request
from ..vectors import Resources
from . import types as T
from .cluster import GCluster
from .instance import Instance
from .node import Node

_POLICY = {
    AllocPolicy.PREFERRED: "preferred",
    AllocPolicy.LAST_RESORT: "last_resort",
    AllocPolicy.UNALLOCATABLE: "unallocable",
}
#: Size limits wide enough that only capacity decides (our requests are not Ganeti specs).
_HUGE = T.ISpec(1 << 31, 1 << 16, 1 << 40, 16, 8, 12)
_TINY = T.ISpec(1, 1, 1, 1, 1, 1)


def _ipolicy(ratio: float) -> T.IPolicy:
    return T.IPolicy(((_TINY, _HUGE),), T.DEFAULT_STD, T.DISK_TEMPLATES, ratio, 32.0)


def _groups(cluster: Cluster) -> tuple[list[T.Group], dict[str, int]]:
    declared = {g.name: g for g in cluster.groups}
    names = list(dict.fromkeys([*declared, *(h.group for h in cluster.hosts)]))
    groups, index = [], {}
    for name in names:
        ratio = max(
            (h.overcommit.get("vcpus", 1.0) for h in cluster.hosts if h.group == name),
            default=1.0,
        )
        policy = declared[name].alloc_policy if name in declared else AllocPolicy.PREFERRED
        index[name] = len(groups)
        groups.append(T.Group(name, f"uuid-{name}", _POLICY[policy], ipolicy=_ipolicy(ratio)))
    return groups, index


def _node(host: Host, group: int, used_mem: float, used_dsk: float) -> Node:
    t_mem = host.total.memory_mib
    n_mem = host.reserved.memory_mib
    t_dsk = host.total.disk_gib * 1024
    res_dsk = host.reserved.disk_gib * 1024
    return Node(
        host.name,
        t_mem,
        int(n_mem),
        int(t_mem - n_mem - used_mem),
        t_dsk,
        int(t_dsk - res_dsk - used_dsk),
        host.total.vcpus,
        int(host.reserved.vcpus),
        host.state != HostState.ONLINE,
        host.spindles,
        0,
        group,
        host.exclusive_storage,
        tags=sorted(host.tags),
    )


def to_ganeti(
    cluster: Cluster,
    at: float | None = None,
    template: str = "plain",
    hold_future: bool = False,
    names: dict[str, str] | None = None,
) -> GCluster:
    """The cluster at time ``at`` (default: its ``now``) as a Ganeti cluster.
    ``names``: instance names by allocation id (default: the id)."""
    moment = cluster.now if at is None else at
    names = names or {}
    groups, gindex = _groups(cluster)
    nodes: list[Node] = []
    instances: list[Instance] = []
    for idx, host in enumerate(cluster.hosts):
        active = [a for a in host.allocations if a.start <= moment < (a.end if a.end else math.inf)]
        shapes = [(names.get(a.id, a.id), a.resources, template, sorted(a.tags)) for a in active]
        if hold_future:
            peak = _future_peak([a for a in host.allocations if a.start > moment])
            if peak is not None:
                shapes.append((f"reserved:{host.name}", peak, "plain", []))
        used_mem = sum(r.memory_mib for _, r, _, _ in shapes)
        used_dsk = sum(r.disk_gib * 1024 for _, r, _, _ in shapes)
        nodes.append(_node(host, gindex[host.group], used_mem, used_dsk))
        for name, res, kind, tags in shapes:
            dsk = int(res.disk_gib * 1024)
            instances.append(
                Instance(
                    name,
                    int(res.memory_mib),
                    dsk,
                    max(1, math.ceil(res.vcpus)),
                    "running",
                    True,
                    idx,
                    -1,
                    kind,
                    tags,
                    1,
                    [(dsk, None)],
                )
            )
    return GCluster.build(groups, nodes, instances, name="vclmgr")


def _future_peak(allocations) -> Resources | None:
    """The most of each resource that allocations starting later hold at once (each
    resource's peak on its own: safe when they peak at different times), or None."""
    if not allocations:
        return None
    events = []
    for a in allocations:
        res = a.resources
        amount = (res.vcpus, res.memory_mib, res.disk_gib)
        events.append((a.start, 1, amount))
        if a.end is not None:
            events.append((a.end, 0, amount))  # ends sort before starts at the same instant
    running = [0.0, 0.0, 0.0]
    peak = [0.0, 0.0, 0.0]
    for _, starting, amount in sorted(events, key=lambda e: (e[0], e[1])):
        sign = 1.0 if starting else -1.0
        for k in range(3):
            running[k] += sign * amount[k]
            peak[k] = max(peak[k], running[k])
    return Resources(*peak)


def iallocator_request(
    cluster: Cluster,
    request: Request,
    usage: dict[str, Iterable[float]],
    eligible: set[str],
) -> dict:
    """An IAllocator ``allocate`` request for ``request``.

    ``usage`` maps host name → peak (vcpus, memory MiB, disk GiB, …) over the request's
    window; each host's usage is shown as one running instance, so the external program
    sees exactly the capacity left. Hosts not in ``eligible`` are reported drained.
    """
    groups, _ = _groups(cluster)
    nodegroups = {
        g.uuid: {
            "name": g.name,
            "alloc_policy": g.alloc_policy,
            "ipolicy": g.ipolicy.to_json(),
            "tags": [],
            "networks": [],
        }
        for g in groups
    }
    nodes, instances = {}, {}
    for host in cluster.hosts:
        vcpus, mem, dsk = list(usage.get(host.name, (0.0, 0.0, 0.0)))[:3]
        node = _node(host, 0, mem, dsk * 1024)
        nodes[host.name] = {
            "total_memory": int(node.t_mem),
            "reserved_memory": node.n_mem,
            "free_memory": node.f_mem,
            "total_disk": int(node.t_dsk),
            "free_disk": node.f_dsk,
            "total_cpus": int(node.t_cpu),
            "reserved_cpus": node.n_cpu,
            "free_spindles": 0,
            "total_spindles": host.spindles,
            "offline": host.state == HostState.OFFLINE,
            "drained": host.state != HostState.ONLINE or host.name not in eligible,
            "group": f"uuid-{host.group}",
            "ndparams": {
                "exclusive_storage": host.exclusive_storage,
                "spindle_count": host.spindles,
            },
            "tags": sorted(host.tags),
            "vm_capable": True,
            "master_candidate": True,
        }
        if mem or vcpus or dsk:
            size = int(dsk * 1024)
            instances[f"{host.name}/usage"] = {
                "memory": int(mem),
                "vcpus": max(1, math.ceil(vcpus)),
                "disk_template": "plain",
                "disks": [{"size": size, "mode": "rw"}],
                "disk_space_total": size,
                "spindle_use": 1,
                "nics": [],
                "tags": [],
                "nodes": [host.name],
                "admin_state": "up",
                "hypervisor": "fake",
                "os": "vclmgr-usage",
            }
    res = request.resources
    size = int(res.disk_gib * 1024)
    return {
        "version": 2,
        "cluster_name": "vclmgr",
        "cluster_tags": [],
        "enabled_hypervisors": ["fake"],
        "ipolicy": _ipolicy(1.0).to_json(),
        "nodegroups": nodegroups,
        "nodes": nodes,
        "instances": instances,
        "request": {
            "type": "allocate",
            "name": request.id,
            "memory": int(math.ceil(res.memory_mib)),
            "vcpus": max(1, math.ceil(res.vcpus)),
            "disk_template": "plain",
            "disks": [{"size": size, "mode": "rw"}],
            "disk_space_total": size,
            "spindle_use": 1,
            "nics": [],
            "tags": sorted(request.tags),
            "os": "vclmgr",
            "hypervisor": "fake",
            "required_nodes": 1,
        },
    }
