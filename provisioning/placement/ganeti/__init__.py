"""Ganeti htools compatibility, answering exactly like Ganeti 3.0 on the same input.

- `text_backend.parse` / `text_backend.serialize`: the htools text backend (hbal -t FILE);
- `handle_iallocator_request(dict) -> dict`: an IAllocator (what hail answers, byte for
  byte once written with `dumps_response`), for `manage.py iallocator REQUEST.json`;
- `run_iallocator`: run an external IAllocator program (hail or any other) on a request;
- `run_hspace` (capacity planning), `balance` (hbal), `squeeze` (hsqueeze);
- `to_ganeti(cluster, at)`: our time-aware `Cluster` seen as a Ganeti cluster at one instant.

Pure Python and stdlib only, like the rest of `provisioning.placement`.
"""

from .allocation import AllocError
from .bridge import iallocator_request, to_ganeti
from .cluster import GCluster
from .external import run_iallocator
from .hbal import HbalOptions, HbalResult, balance
from .hspace import HSpaceError, HSpaceOptions, HSpaceResult, Spec, run_hspace
from .hsqueeze import squeeze
from .iallocator import IAllocatorError, dumps_response, handle_iallocator_request, loads_request
from .simulate import simulated_cluster

__all__ = [
    "AllocError",
    "GCluster",
    "HSpaceError",
    "HSpaceOptions",
    "HSpaceResult",
    "HbalOptions",
    "HbalResult",
    "IAllocatorError",
    "Spec",
    "balance",
    "dumps_response",
    "handle_iallocator_request",
    "iallocator_request",
    "loads_request",
    "run_hspace",
    "run_iallocator",
    "simulated_cluster",
    "squeeze",
    "to_ganeti",
]
