"""vclmgr's placement core: pure Python, plain data in, decisions out.

No Django, no database, no I/O (except the `external` policy, which runs an IAllocator
program when asked). Loaders at the edge build a `Cluster` snapshot; this package answers:

- where does a request go (`place`, `PlacementEngine.place`), or why not, and from when it
  would fit (`earliest_fit`);
- N requests at once, optionally all-or-nothing (`place_many`);
- an environment's VMs as a gang: all or none, those of one private network on one host
  (`place_gang`, `earliest_gang_fit`);
- Ganeti compatibility in `placement.ganeti`: the htools text format, the
  IAllocator protocol both ways, capacity planning (hspace), balancing (hbal) and
  consolidation (hsqueeze).
"""

#: Public name -> its module. Imported on first use (PEP 562), so that a tool using one
#: corner of the package (``python -m placement.ganeti.cli hspace``) does not
#: pay for the engine and numpy at start-up.
_EXPORTS = {
    "PlacementEngine": "engine",
    **dict.fromkeys(
        ("Allocation", "AllocPolicy", "Cluster", "Host", "HostState", "NodeGroup", "Policy", "Request"),
        "model",
    ),
    **dict.fromkeys(("earliest_fit", "place", "place_many"), "oneshot"),
    **dict.fromkeys(("Gang", "GangResult", "earliest_gang_fit", "place_gang"), "gang"),
    "PlacementOptions": "options",
    **dict.fromkeys(("EarliestFit", "Miss", "MultiPlacementResult", "PlacementResult", "format_time"), "result"),
    "Resources": "vectors",
}

__all__ = sorted(_EXPORTS)


def lazy_exports(package: str, exports: dict[str, str]):
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) that import each public name's
    module on first use and keep the name in the package's globals from then on."""
    import sys

    def __getattr__(name):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
