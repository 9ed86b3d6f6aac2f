"""Ganeti's IAllocator protocol, both ways: we answer requests like hail does.

Contract: `handle_iallocator_request(request_dict) -> response_dict` reads a Ganeti
IAllocator request (version 2: ``cluster_tags``, ``enabled_hypervisors``, ``nodegroups``,
``nodes``, ``instances``, ``request``) and answers ``allocate``, ``multi-allocate``,
``relocate``, ``node-evacuate`` and ``change-group`` with our hail-equivalent allocator:
``{"success": bool, "info": "Request successful: …" | "Request failed: …", "result": …}``.
`dumps_response` formats it byte-for-byte as hail prints it. A malformed request raises
`IAllocatorError` (hail: exit 1, ``Error: …`` on stderr) — `manage.py iallocator` should do
the same.

As hail does, with hypervisor ``kvm`` every node's reserved memory is replaced by
``static_kvm_node_memory`` (4096 MiB; 0 keeps the reported value).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from . import types as T
from .allocation import AllocError, AllocOptions, alloc_list, try_group_alloc, try_mg_alloc
from .cluster import GCluster
from .evacuate import EVAC_MODES, change_group, node_evacuate
from .instance import NO_NODE, Instance
from .node import Node

DEFAULT_STATIC_KVM_MEMORY = 4096


class IAllocatorError(ValueError):
    """The request itself is invalid (not: "no node fits")."""


@dataclass(slots=True)
class IAllocRequest:
    kind: str
    cluster: GCluster
    body: dict
    warnings: list[str] = field(default_factory=list)


def _need(obj: dict, key: str, what: str):
    if key not in obj:
        raise IAllocatorError(f"invalid data for {what}: missing key '{key}'")
    return obj[key]


def _instance(name: str, data: dict) -> Instance:
    what = f"instance '{name}'"
    disks = _need(data, "disks", what)
    state = data.get("admin_state", "up")
    status = {"up": "running", "down": "ADMIN_down", "offline": "ADMIN_offline"}.get(state)
    if status is None:
        raise IAllocatorError(f"invalid admin_state {state!r} for {what}")
    template = _need(data, "disk_template", what)
    if template not in T.DISK_TEMPLATES:
        raise IAllocatorError(f"invalid disk template {template!r} for {what}")
    return Instance(
        name,
        int(_need(data, "memory", what)),
        int(_need(data, "disk_space_total", what)),
        int(_need(data, "vcpus", what)),
        status,
        True,
        NO_NODE,
        NO_NODE,
        template,
        list(_need(data, "tags", what)),
        int(_need(data, "spindle_use", what)),
        [(int(d["size"]), d.get("spindles")) for d in disks],
        bool(data.get("forthcoming", False)),
        extra={"nics": data.get("nics", [])},
    )


def parse_request(
    data: dict, static_kvm_node_memory: int = DEFAULT_STATIC_KVM_MEMORY
) -> IAllocRequest:
    if not isinstance(data, dict):
        raise IAllocatorError("invalid iallocator message: not a JSON object")
    request = _need(data, "request", "iallocator message")
    groups: list[T.Group] = []
    group_index: dict[str, int] = {}
    for uuid, g in _need(data, "nodegroups", "iallocator message").items():
        group_index[uuid] = len(groups)
        groups.append(
            T.Group(
                _need(g, "name", f"group '{uuid}'"),
                uuid,
                _need(g, "alloc_policy", f"group '{uuid}'"),
                list(g.get("tags", [])),
                list(g.get("networks", [])),
                T.IPolicy.from_json(g.get("ipolicy")),
            )
        )
    hypervisors = data.get("enabled_hypervisors") or []
    kvm = bool(hypervisors) and hypervisors[0] == "kvm" and static_kvm_node_memory > 0
    nodes: list[Node] = []
    node_index: dict[str, int] = {}
    for name, n in _need(data, "nodes", "iallocator message").items():
        nodes.append(_node(name, n, group_index, kvm, static_kvm_node_memory))
        node_index[name] = len(nodes) - 1
    instances: list[Instance] = []
    for name, i in _need(data, "instances", "iallocator message").items():
        inst = _instance(name, i)
        inst_nodes = _need(i, "nodes", f"instance '{name}'")
        if not inst_nodes:
            raise IAllocatorError(f"empty node list for instance {name}")
        for node_name in inst_nodes[:2]:
            if node_name not in node_index:
                raise IAllocatorError(f"Unknown node '{node_name}' for instance {name}")
        inst.pnode = node_index[inst_nodes[0]]
        inst.snode = node_index[inst_nodes[1]] if len(inst_nodes) > 1 else NO_NODE
        inst.movable = inst.disk_template in T.MOVABLE
        instances.append(inst)
    cluster = GCluster.build(
        groups,
        nodes,
        instances,
        list(data.get("cluster_tags", [])),
        T.DEFAULT_IPOLICY,
        name=data.get("cluster_name", "cluster"),
    )
    kind = _need(request, "type", "request")
    if kind not in ("allocate", "multi-allocate", "relocate", "node-evacuate", "change-group"):
        raise IAllocatorError(f"Invalid request type '{kind}'")
    return IAllocRequest(kind, cluster, request)


def _node(name, n, group_index, kvm: bool, static_mem: int) -> Node:
    what = f"node '{name}'"
    offline = bool(_need(n, "offline", what))
    drained = bool(_need(n, "drained", what))
    guuid = _need(n, "group", what)
    if guuid not in group_index:
        raise IAllocatorError(f"Unknown group '{guuid}' for node {name}")
    ndparams = _need(n, "ndparams", what)
    excl = bool(ndparams.get("exclusive_storage", False))
    live = not offline and n.get("vm_capable", True)

    def value(key, default):
        return _need(n, key, what) if live else default

    spindles = value("total_spindles", 0) if excl else ndparams.get("spindle_count", 1)
    node = Node(
        name,
        float(value("total_memory", 0.0)),
        int(value("reserved_memory", 0)),
        int(value("free_memory", 0)),
        float(value("total_disk", 0.0)),
        int(value("free_disk", 0)),
        float(value("total_cpus", 0.0)),
        int(value("reserved_cpus", 0)),
        (not live) or drained,
        int(spindles),
        int(value("free_spindles", 0)),
        group_index[guuid],
        excl,
        tags=list(n.get("tags", [])),
    )
    if kvm:
        node.n_mem = static_mem
    return node


def _request_instance(req: dict) -> tuple[Instance, int, str | None]:
    name = _need(req, "name", "request")
    return _instance(name, req), int(_need(req, "required_nodes", "request")), None


def handle_iallocator_request(
    data: dict,
    capacity_checks: bool = True,
    ignore_soft_errors: bool = False,
    static_kvm_node_memory: int = DEFAULT_STATIC_KVM_MEMORY,
) -> dict:
    req = parse_request(data, static_kvm_node_memory)
    body = req.body
    restrict = body.get("restrict-to-nodes")
    opts = AllocOptions(
        capacity=capacity_checks,
        ignore_soft_errors=ignore_soft_errors,
        restrict_to_nodes=frozenset(restrict) if restrict else None,
    )
    try:
        info, result = _process(req, opts)
    except (AllocError, ValueError, KeyError) as exc:
        return {"success": False, "info": f"Request failed: {_message(exc)}", "result": []}
    return {"success": True, "info": f"Request successful: {info}", "result": result}


def _message(exc: Exception) -> str:
    return exc.args[0] if exc.args else str(exc)


def _process(req: IAllocRequest, opts: AllocOptions):
    body, cluster = req.body, req.cluster
    if req.kind == "allocate":
        inst, count, _ = _request_instance(body)
        group = body.get("group_name")
        if group is None:
            sol = try_mg_alloc(opts, cluster, inst, count)
        else:
            sol = try_group_alloc(opts, cluster, group, inst, count)
        info = ", ".join(sol.log)
        if sol.solution is None:
            raise AllocError(info)
        return info, sol.solution.node_names()
    if req.kind == "multi-allocate":
        group = body.get("group_name")
        requests = []
        for item in _need(body, "instances", "request"):
            inst, count, _ = _request_instance(item)
            requests.append((inst, count, group))
        _, results = alloc_list(opts, cluster, requests)
        done = [(i.name, sol.solution.node_names()) for i, sol in results if sol.solution]
        failed = [(i.name, ", ".join(sol.log)) for i, sol in results if sol.solution is None]
        info = (
            f"{len(failed)} instances failed to allocate and "
            f"{len(done)} were allocated successfully"
        )
        return info, [[[n, nodes] for n, nodes in done], [[n, m] for n, m in failed]]
    if req.kind == "relocate":
        return "success", _relocate(cluster, body)
    if req.kind == "node-evacuate":
        mode = _need(body, "evac_mode", "request")
        if mode not in EVAC_MODES:
            raise IAllocatorError(f"invalid evac_mode {mode!r}")
        res = node_evacuate(cluster, mode, _need(body, "instances", "request"))
    else:
        res = change_group(
            cluster, _need(body, "instances", "request"), body.get("target_groups") or []
        )
    info = (
        f"{len(res.failed)} instances failed to move and {len(res.moved)} were moved successfully"
    )
    return info, res.to_json()


def _relocate(cluster: GCluster, body: dict) -> list[str]:
    name = _need(body, "name", "request")
    idx = cluster.instance_index(name)
    inst = cluster.instances[idx]
    if int(_need(body, "required_nodes", "request")) != 1:
        raise AllocError(f"Exchange {body['required_nodes']} nodes mode is not implemented")
    mirror = inst.mirror
    if mirror == T.MIRROR_NONE:
        raise AllocError("Can't relocate non-mirrored instances")
    expected = inst.snode if mirror == T.MIRROR_INTERNAL else inst.pnode
    excluded = [cluster.node_index(n) for n in _need(body, "relocate_from", "request")]
    kind = "secondary" if mirror == T.MIRROR_INTERNAL else "primary"
    if excluded != [expected]:
        raise AllocError(
            "Unsupported request: excluded nodes not equal to instance's "
            f"{kind}({expected} versus {excluded})"
        )
    mode = "secondary-only" if mirror == T.MIRROR_INTERNAL else "primary-only"
    res = node_evacuate(cluster, mode, [name])
    if res.failed:
        raise AllocError(res.failed[0][1])
    _, _, nodes = res.moved[0]
    return [nodes[1]] if mirror == T.MIRROR_INTERNAL else [nodes[0]]


def dumps_response(response: dict) -> str:
    """One line, compact, keys in hail's order."""
    ordered = {k: response[k] for k in ("success", "info", "result")}
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False)


def loads_request(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise IAllocatorError(f"Parsing input IAllocator message: Malformed JSON: {exc}") from exc
