"""vclmgr's placement core: pure Python, plain data in, decisions out.

No Django, no database, no I/O (except the `external` policy, which runs an IAllocator
program when asked). Loaders at the edge build a `Cluster` snapshot; this package answers:

- where does a request go (`place`, `PlacementEngine.place`), or why not, and from when it
  would fit (`earliest_fit`);
- N requests at once, optionally all-or-nothing (`place_many`);
- Ganeti compatibility in `provisioning.placement.ganeti`: the htools text format, the
  IAllocator protocol both ways, capacity planning (hspace), balancing (hbal) and
  consolidation (hsqueeze).
"""

#: Public name -> its module. Imported on first use (PEP 562), so that a tool using one
#: corner of the package (``python -m provisioning.placement.ganeti.cli hspace``) does not
#: pay for the engine and numpy at start-up.
_EXPORTS = {
    "PlacementEngine": "engine",
    **dict.fromkeys(
        ("Allocation", "AllocPolicy", "Cluster", "Host", "HostState", "NodeGroup", "Policy", "Request"),
        "model",
    ),
    **dict.fromkeys(("earliest_fit", "place", "place_many"), "oneshot"),
    "PlacementOptions": "options",
    **dict.fromkeys(("EarliestFit", "Miss", "MultiPlacementResult", "PlacementResult", "format_time"), "result"),
    "Resources": "vectors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
