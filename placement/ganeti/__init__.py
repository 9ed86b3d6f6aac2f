"""Ganeti htools compatibility, answering exactly like Ganeti 3.0 on the same input.

- `text_backend.parse` / `text_backend.serialize`: the htools text backend (hbal -t FILE);
- `handle_iallocator_request(dict) -> dict`: an IAllocator (what hail answers, byte for
  byte once written with `dumps_response`), for `manage.py iallocator REQUEST.json`;
- `run_iallocator`: run an external IAllocator program (hail or any other) on a request;
- `run_hspace` (capacity planning), `balance` (hbal), `squeeze` (hsqueeze);
- `to_ganeti(cluster, at)`: our time-aware `Cluster` seen as a Ganeti cluster at one instant.

Pure Python (numpy where it pays), like the rest of `placement`. Names are
imported on first use, so the command-line tools (`cli`) start without what they do not need.
"""

from .. import lazy_exports

_EXPORTS = {
    "AllocError": "allocation",
    "iallocator_request": "bridge",
    "to_ganeti": "bridge",
    "GCluster": "cluster",
    "run_iallocator": "external",
    **dict.fromkeys(("HbalOptions", "HbalResult", "balance"), "hbal"),
    **dict.fromkeys(("HSpaceError", "HSpaceOptions", "HSpaceResult", "Spec", "run_hspace"), "hspace"),
    "squeeze": "hsqueeze",
    **dict.fromkeys(("IAllocatorError", "dumps_response", "handle_iallocator_request", "loads_request"), "iallocator"),
    "simulated_cluster": "simulate",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
