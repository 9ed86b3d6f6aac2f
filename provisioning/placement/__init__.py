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

from .engine import PlacementEngine
from .model import (
    Allocation,
    AllocPolicy,
    Cluster,
    Host,
    HostState,
    NodeGroup,
    Policy,
    Request,
)
from .oneshot import earliest_fit, place, place_many
from .options import PlacementOptions
from .result import EarliestFit, Miss, MultiPlacementResult, PlacementResult, format_time
from .vectors import Resources

__all__ = [
    "Allocation",
    "AllocPolicy",
    "Cluster",
    "EarliestFit",
    "Host",
    "HostState",
    "Miss",
    "MultiPlacementResult",
    "NodeGroup",
    "PlacementEngine",
    "PlacementOptions",
    "PlacementResult",
    "Policy",
    "Request",
    "Resources",
    "earliest_fit",
    "format_time",
    "place",
    "place_many",
]
