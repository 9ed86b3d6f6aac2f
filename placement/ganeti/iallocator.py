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
from .cluster import EXCLUSION_TAG_PREFIX, GCluster
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


def _keys(obj: dict) -> str:
    return json.dumps(list(obj), separators=(",", ":"), ensure_ascii=False)


def _need(obj: dict, key: str, what: str):
    """``obj[key]``, or hail's error; ``what`` is the context ("invalid request dict")."""
    if not isinstance(obj, dict):
        raise IAllocatorError(f"{what}: Unable to read JSObject")
    if key not in obj:
        raise IAllocatorError(f"{what}: key '{key}' not found, object contains only {_keys(obj)}")
    return obj[key]


def _int(obj: dict, key: str, what: str) -> int:
    """A JSON number as hail reads an Int (Haskell ``round``: half to even, as Python)."""
    value = _need(obj, key, what)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise IAllocatorError(f"{what}: key '{key}': Unable to read Int")
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        raise IAllocatorError(f"{what}: key '{key}': Unable to read Int")
    return value if isinstance(value, int) else round(value)


def _double(obj: dict, key: str, what: str) -> float:
    value = _need(obj, key, what)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise IAllocatorError(f"{what}: key '{key}': Unable to read Double")
    return float(value)


def _typed(obj: dict, key: str, what: str, kind: type, label: str):
    """``obj[key]``, which must be a ``kind`` (hail's "Unable to read <label>" if not)."""
    value = _need(obj, key, what)
    if not isinstance(value, kind):
        raise IAllocatorError(f"{what}: key '{key}': Unable to read {label}")
    return value


def _bool(obj: dict, key: str, what: str) -> bool:
    return _typed(obj, key, what, bool, "Bool")


def _str(obj: dict, key: str, what: str) -> str:
    return _typed(obj, key, what, str, "String")


def _list(obj: dict, key: str, what: str) -> list:
    return _typed(obj, key, what, list, "list")


def _object(obj: dict, key: str, what: str) -> dict:
    return _typed(obj, key, what, dict, "JSObject")


def _strings(obj: dict, key: str, what: str) -> list[str]:
    values = _list(obj, key, what)
    if not all(isinstance(v, str) for v in values):
        raise IAllocatorError(f"{what}: key '{key}': Unable to read String")
    return values


def _instance(name: str, data: dict) -> Instance:
    what = f"invalid data for instance '{name}'"
    if not isinstance(data, dict):
        raise IAllocatorError(f"{what}: Unable to read JSObject")
    disks = _list(data, "disks", what)
    for disk in disks:
        if not isinstance(disk, dict):
            raise IAllocatorError(f"{what}: key 'disks': Unable to read JSObject")
    state = data.get("admin_state", "up")
    status = {"up": "running", "down": "ADMIN_down", "offline": "ADMIN_offline"}.get(state)
    if status is None:
        raise IAllocatorError(f"{what}: key 'admin_state': Invalid string value for type AdminState: {state!r}")
    template = _need(data, "disk_template", what)
    if template not in T.DISK_TEMPLATES:
        raise IAllocatorError(
            f"{what}: key 'disk_template': Invalid string value for type DiskTemplate: {json.dumps(template)}"
        )
    return Instance(
        name,
        _int(data, "memory", what),
        _int(data, "disk_space_total", what),
        _int(data, "vcpus", what),
        status,
        True,
        NO_NODE,
        NO_NODE,
        template,
        list(_strings(data, "tags", what)),
        _int(data, "spindle_use", what),
        [(_int(d, "size", what), _optional_int(d, "spindles", what)) for d in disks],
        bool(data.get("forthcoming", False)),
        extra={"nics": data.get("nics", [])},
    )


def _optional_int(obj: dict, key: str, what: str) -> int | None:
    return None if obj.get(key) is None else _int(obj, key, what)


def parse_request(data: dict, static_kvm_node_memory: int = DEFAULT_STATIC_KVM_MEMORY) -> IAllocRequest:
    """Parse and validate the whole message, as hail does before answering: any malformed
    field raises `IAllocatorError` naming it (hail: exit 1, ``Error: …``)."""
    msg = "invalid iallocator message"
    if not isinstance(data, dict):
        raise IAllocatorError(f"{msg}: Unable to read JSObject")
    request = _object(data, "request", msg)
    groups: list[T.Group] = []
    group_index: dict[str, int] = {}
    for uuid, g in _object(data, "nodegroups", msg).items():
        what = f"invalid data for group '{uuid}'"
        group_index[uuid] = len(groups)
        policy = _str(g, "alloc_policy", what)
        if policy not in T.ALLOC_POLICIES:
            raise IAllocatorError(
                f"{what}: key 'alloc_policy': Invalid string value for type AllocPolicy: {json.dumps(policy)}"
            )
        try:
            ipolicy = T.IPolicy.from_json(g.get("ipolicy"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IAllocatorError(f"{what}: key 'ipolicy': invalid policy ({exc})") from None
        groups.append(
            T.Group(
                _str(g, "name", what),
                uuid,
                policy,
                list(g.get("tags", [])),
                list(g.get("networks", [])),
                ipolicy,
            )
        )
    hypervisors = data.get("enabled_hypervisors") or []
    kvm = bool(hypervisors) and hypervisors[0] == "kvm" and static_kvm_node_memory > 0
    nodes: list[Node] = []
    node_index: dict[str, int] = {}
    for name, n in _object(data, "nodes", msg).items():
        nodes.append(_node(name, n, group_index, kvm, static_kvm_node_memory))
        node_index[name] = len(nodes) - 1
    instances: list[Instance] = []
    for name, i in _object(data, "instances", msg).items():
        inst = _instance(name, i)
        inst_nodes = _strings(i, "nodes", f"invalid data for instance '{name}'")
        if not inst_nodes:
            raise IAllocatorError(f"empty node list for instance {name}")
        for node_name in inst_nodes[:2]:
            if node_name not in node_index:
                raise IAllocatorError(f"Unknown node '{node_name}' for instance {name}")
        inst.pnode = node_index[inst_nodes[0]]
        inst.snode = node_index[inst_nodes[1]] if len(inst_nodes) > 1 else NO_NODE
        inst.movable = inst.disk_template in T.MOVABLE
        instances.append(inst)
    cluster_tags = _strings(data, "cluster_tags", msg) if "cluster_tags" in data else []
    cluster = GCluster.build(
        groups,
        nodes,
        instances,
        list(cluster_tags),
        T.DEFAULT_IPOLICY,
        name=data.get("cluster_name", "cluster"),
    )
    kind = _need(request, "type", "invalid request dict")
    if kind not in ("allocate", "multi-allocate", "relocate", "node-evacuate", "change-group"):
        raise IAllocatorError(f"Invalid request type '{kind}'")
    req = IAllocRequest(kind, cluster, request)
    _validate_body(req)
    return req


_REQ = "invalid request dict"


def _validate_body(req: IAllocRequest) -> None:
    """The request's own fields: sizes are numbers, names name known objects."""
    body, cluster = req.body, req.cluster
    if req.kind == "allocate":
        _request_instance(body, cluster)
    elif req.kind == "multi-allocate":
        items = _list(body, "instances", _REQ)
        for item in items:
            _request_instance(item, cluster)
    elif req.kind == "relocate":
        name = _str(body, "name", _REQ)
        _known_instances(cluster, [name], "name")
        _int(body, "required_nodes", _REQ)
        _known_nodes(cluster, _strings(body, "relocate_from", _REQ), "relocate_from")
    else:
        _known_instances(cluster, _strings(body, "instances", _REQ), "instances")
        if req.kind == "node-evacuate":
            mode = _need(body, "evac_mode", _REQ)
            if mode not in EVAC_MODES:
                raise IAllocatorError(
                    f"{_REQ}: key 'evac_mode': Invalid string value for type EvacMode: {json.dumps(mode)}"
                    f" (one of {', '.join(EVAC_MODES)})"
                )
        else:
            targets = _strings(body, "target_groups", _REQ) if body.get("target_groups") is not None else []
            for group in targets:
                if not any(group in (g.name, g.uuid) for g in cluster.groups):
                    raise IAllocatorError(f"{_REQ}: key 'target_groups': unknown node group '{group}'")


def _known_instances(cluster: GCluster, names: list[str], key: str) -> None:
    known = {i.name for i in cluster.instances}
    for name in names:
        if name not in known:
            raise IAllocatorError(f"{_REQ}: key '{key}': Unknown instance '{name}'")


def _known_nodes(cluster: GCluster, names: list[str], key: str) -> None:
    known = {n.name for n in cluster.nodes}
    for name in names:
        if name not in known:
            raise IAllocatorError(f"{_REQ}: key '{key}': Unknown node '{name}'")


def _node(name, n, group_index, kvm: bool, static_mem: int) -> Node:
    what = f"invalid data for node '{name}'"
    offline = _bool(n, "offline", what)
    drained = _bool(n, "drained", what)
    guuid = _str(n, "group", what)
    if guuid not in group_index:
        raise IAllocatorError(f"Unknown group '{guuid}' for node {name}")
    ndparams = _object(n, "ndparams", what)
    excl = bool(ndparams.get("exclusive_storage", False))
    live = not offline and n.get("vm_capable", True)

    def number(read, key, default):
        return read(n, key, what) if live else default

    if excl:
        spindles = number(_int, "total_spindles", 0)
    else:
        spindles = _int(ndparams, "spindle_count", f"{what}: key 'ndparams'") if "spindle_count" in ndparams else 1
    node = Node(
        name,
        number(_double, "total_memory", 0.0),
        number(_int, "reserved_memory", 0),
        number(_int, "free_memory", 0),
        number(_double, "total_disk", 0.0),
        number(_int, "free_disk", 0),
        number(_double, "total_cpus", 0.0),
        number(_int, "reserved_cpus", 0),
        (not live) or drained,
        spindles,
        number(_int, "free_spindles", 0),
        group_index[guuid],
        excl,
        tags=list(_strings(n, "tags", what)) if "tags" in n else [],
    )
    if kvm:
        node.n_mem = static_mem
    return node


def _request_instance(req: dict, cluster: GCluster) -> tuple[Instance, int, str | None]:
    """The instance an allocate request describes, with the cluster's exclusion tags
    applied (as htools does for the instances it loads)."""
    if not isinstance(req, dict):
        raise IAllocatorError(f"{_REQ}: key 'instances': Unable to read JSObject")
    name = _str(req, "name", _REQ)
    inst = _instance(name, req)
    prefixes = [t[len(EXCLUSION_TAG_PREFIX) :] for t in cluster.tags if t.startswith(EXCLUSION_TAG_PREFIX)]
    prefixes = [p for p in prefixes if p]
    inst.excl_tags = [t for t in inst.tags if any(t.startswith(p) for p in prefixes)]
    return inst, _int(req, "required_nodes", _REQ), None


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
    except IAllocatorError:
        raise
    except (AllocError, ValueError, KeyError) as exc:
        return {"success": False, "info": f"Request failed: {_message(exc)}", "result": []}
    return {"success": True, "info": f"Request successful: {info}", "result": result}


def _message(exc: Exception) -> str:
    return exc.args[0] if exc.args else str(exc)


def _process(req: IAllocRequest, opts: AllocOptions):
    body, cluster = req.body, req.cluster
    if req.kind == "allocate":
        inst, count, _ = _request_instance(body, cluster)
        group = body.get("group_name")
        _check_group(cluster, group)
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
        _check_group(cluster, group)
        requests = []
        for item in _list(body, "instances", _REQ):
            inst, count, _ = _request_instance(item, cluster)
            requests.append((inst, count, group))
        _, results = alloc_list(opts, cluster, requests)
        done = [(i.name, sol.solution.node_names()) for i, sol in results if sol.solution]
        failed = [(i.name, ", ".join(sol.log)) for i, sol in results if sol.solution is None]
        info = f"{len(failed)} instances failed to allocate and {len(done)} were allocated successfully"
        return info, [[[n, nodes] for n, nodes in done], [[n, m] for n, m in failed]]
    if req.kind == "relocate":
        return "success", _relocate(cluster, body)
    if req.kind == "node-evacuate":
        res = node_evacuate(cluster, body["evac_mode"], body["instances"])
    else:
        res = change_group(cluster, body["instances"], body.get("target_groups") or [])
    info = f"{len(res.failed)} instances failed to move and {len(res.moved)} were moved successfully"
    return info, res.to_json()


def _check_group(cluster: GCluster, group) -> None:
    """An unknown ``group_name`` is a failed answer (exit 0), in hail's words."""
    if group is not None and not any(group in (g.name, g.uuid) for g in cluster.groups):
        raise AllocError(f"Wrong number of elems found with name {group}")


def _relocate(cluster: GCluster, body: dict) -> list[str]:
    name = body["name"]
    idx = cluster.instance_index(name)
    inst = cluster.instances[idx]
    if _int(body, "required_nodes", _REQ) != 1:
        raise AllocError(f"Exchange {body['required_nodes']} nodes mode is not implemented")
    mirror = inst.mirror
    if mirror == T.MIRROR_NONE:
        raise AllocError("Can't relocate non-mirrored instances")
    expected = inst.snode if mirror == T.MIRROR_INTERNAL else inst.pnode
    excluded = [cluster.node_index(n) for n in body["relocate_from"]]
    kind = "secondary" if mirror == T.MIRROR_INTERNAL else "primary"
    if excluded != [expected]:
        raise AllocError(
            f"Unsupported request: excluded nodes not equal to instance's {kind}({expected} versus {excluded})"
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
