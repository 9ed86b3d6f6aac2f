"""Decision inputs as JSON: save a placement's input, replay it later as a golden test.

Contract: `cluster_to_dict`/`cluster_from_dict` and `request_to_dict`/`request_from_dict`
round-trip the model through plain JSON types (times stay epoch seconds). `decision_record`
bundles a cluster, requests, the options and the results into one document (what
`manage.py place --save` and the refused-decision trail write, as hail's ``--save``);
`replay` places the requests again with the record's options and returns the results, so
a stored record (tests/data/placement/decisions) can be compared field by field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .engine import PlacementEngine
from .model import Allocation, Cluster, Host, NodeGroup, Policy, Request
from .options import PlacementOptions
from .result import PlacementResult
from .vectors import Resources


def _res(r: Resources) -> dict:
    return {k: v for k, v in r.as_dict().items() if v}


def allocation_to_dict(a: Allocation) -> dict:
    out = {"id": a.id, "resources": _res(a.resources), "start": a.start, "end": a.end}
    if a.anti_affinity:
        out["anti_affinity"] = a.anti_affinity
    if a.tags:
        out["tags"] = sorted(a.tags)
    return out


def allocation_from_dict(d: dict) -> Allocation:
    return Allocation(
        str(d["id"]),
        Resources.from_dict(d.get("resources", {})),
        d["start"],
        d.get("end"),
        d.get("anti_affinity"),
        frozenset(d.get("tags", ())),
    )


def host_to_dict(h: Host) -> dict:
    d = {
        "name": h.name,
        "total": _res(h.total),
        "reserved": _res(h.reserved),
        "overcommit": dict(h.overcommit),
        "state": str(h.state),
        "group": h.group,
        "hypervisor": h.hypervisor,
        "tags": sorted(h.tags),
        "exclusive_storage": h.exclusive_storage,
        "max_vms": h.max_vms,
        "spindles": h.spindles,
        "allocations": [allocation_to_dict(a) for a in h.allocations],
    }
    if h.available_until is not None:  # only then: older decision records stay byte for byte
        d["available_until"] = h.available_until
    if h.overlay is not None:
        d["overlay"] = h.overlay
    return d


def host_from_dict(d: dict) -> Host:
    return Host(
        d["name"],
        Resources.from_dict(d["total"]),
        Resources.from_dict(d.get("reserved", {})),
        d.get("overcommit", {}),
        d.get("state", "online"),
        d.get("group", "default"),
        d.get("hypervisor", "kvm"),
        frozenset(d.get("tags", ())),
        d.get("exclusive_storage", False),
        d.get("max_vms"),
        d.get("spindles", 1),
        tuple(allocation_from_dict(a) for a in d.get("allocations", ())),
        d.get("available_until"),
        d.get("overlay"),
    )


def group_to_dict(g: NodeGroup) -> dict:
    return {
        "name": g.name,
        "alloc_policy": str(g.alloc_policy),
        "policy": str(g.policy),
        "iallocator": g.iallocator,
    }


def group_from_dict(d: dict) -> NodeGroup:
    return NodeGroup(
        d["name"],
        d.get("alloc_policy", "preferred"),
        d.get("policy", "balanced"),
        d.get("iallocator"),
        frozenset(d.get("tags", ())),
    )


def cluster_to_dict(c: Cluster) -> dict:
    return {
        "now": c.now,
        "groups": [group_to_dict(g) for g in c.groups],
        "hosts": [host_to_dict(h) for h in c.hosts],
    }


def cluster_from_dict(d: dict) -> Cluster:
    return Cluster(
        tuple(host_from_dict(h) for h in d["hosts"]),
        tuple(group_from_dict(g) for g in d.get("groups", ())),
        d.get("now", 0.0),
    )


def request_to_dict(r: Request) -> dict:
    out = {"id": r.id, "resources": _res(r.resources), "start": r.start, "end": r.end}
    for key in ("hypervisors", "groups"):
        value = getattr(r, key)
        if value is not None:
            out[key] = sorted(value)
    for key in ("required_tags", "forbidden_tags", "tags"):
        if getattr(r, key):
            out[key] = sorted(getattr(r, key))
    if r.anti_affinity:
        out["anti_affinity"] = r.anti_affinity
    if r.policy is not None:
        out["policy"] = str(r.policy)
    if r.exclusive_storage:
        out["exclusive_storage"] = True
    if r.gpus_any:
        out["gpus_any"] = r.gpus_any
    if r.overlay is not None:
        out["overlay"] = r.overlay
    return out


def request_from_dict(d: dict) -> Request:
    def maybe_set(key):
        return None if d.get(key) is None else frozenset(d[key])

    return Request(
        Resources.from_dict(d.get("resources", {})),
        d.get("start", 0.0),
        d.get("end"),
        str(d.get("id", "request")),
        maybe_set("hypervisors"),
        frozenset(d.get("required_tags", ())),
        frozenset(d.get("forbidden_tags", ())),
        d.get("anti_affinity"),
        d.get("policy"),
        d.get("exclusive_storage", False),
        maybe_set("groups"),
        frozenset(d.get("tags", ())),
        int(d.get("gpus_any", 0)),
        overlay=d.get("overlay"),
    )


#: Scores in decision records are rounded: the decision is what a record pins down, not the
#: last bits of a float sum (which change with the order of additions).
SCORE_DIGITS = 9


def options_to_dict(options: PlacementOptions) -> dict:
    """The options that differ from the defaults (a record stays short and readable)."""
    default = PlacementOptions()
    out = {}
    for f in dataclasses.fields(PlacementOptions):
        value = getattr(options, f.name)
        if value != getattr(default, f.name):
            out[f.name] = str(value) if f.name == "default_policy" else value
    return out


def options_from_dict(d: dict) -> PlacementOptions:
    values = dict(d)
    if "default_policy" in values:
        values["default_policy"] = Policy(values["default_policy"])
    return PlacementOptions(**values)


def decision_dict(result: PlacementResult) -> dict:
    """A result as a record stores it (score rounded, see SCORE_DIGITS)."""
    decision = result.to_dict()
    if decision.get("score") is not None:
        decision["score"] = round(decision["score"], SCORE_DIGITS)
    return decision


def replay(record: dict, options: PlacementOptions | None = None) -> list[dict]:
    """Place the record's requests in order (each committed if placed); results as dicts.
    ``options`` default to the record's own."""
    if options is None:
        options = options_from_dict(record.get("options", {}))
    engine = PlacementEngine(cluster_from_dict(record["cluster"]), options)
    out = []
    for req in record["requests"]:
        result = engine.place(request_from_dict(req))
        if result.ok:
            engine.commit(result)
        out.append(decision_dict(result))
    return out


def decision_record(
    cluster: Cluster,
    requests: Iterable[Request],
    options: PlacementOptions | None = None,
    note: str = "",
    results: Iterable[PlacementResult] | None = None,
) -> dict:
    """A replayable record. ``results``: the decisions as given live (else replayed here)."""
    record = {
        "note": note,
        "cluster": cluster_to_dict(cluster),
        "requests": [request_to_dict(r) for r in requests],
        "options": options_to_dict(options or PlacementOptions()),
    }
    record["expected"] = replay(record) if results is None else [decision_dict(r) for r in results]
    return record
