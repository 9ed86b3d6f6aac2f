"""vclmgr's placement core: pure Python, plain data in, decisions out.

No Django, no database, no I/O (except the `external` policy, which runs an IAllocator
program when asked). Loaders at the edge build a `Cluster` snapshot; this package answers:

- where does a request go (`place`, `PlacementEngine.place`), or why not, and from when it
  would fit (`earliest_fit`);
- N requests at once, optionally all-or-nothing (`place_many`);
- which moves would balance the hosts at a moment (`rebalance`), or empty the least-loaded
  hosts at low load (`consolidate`), never breaking a future reservation;
- Ganeti compatibility in `provisioning.placement.ganeti`: the htools text format, the
  IAllocator protocol both ways, capacity planning (hspace), balancing (hbal) and
  consolidation (hsqueeze).
"""

from .api import earliest_fit, place, place_many
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
from .options import PlacementOptions
from .placer import PlacementEngine
from .rebalance import (
    ConsolidationPlan,
    PlannedMove,
    RebalanceOptions,
    RebalancePlan,
    consolidate,
    rebalance,
)
from .resources import Resources
from .result import EarliestFit, Miss, MultiPlacementResult, PlacementResult, format_time

__all__ = [
    "Allocation",
    "AllocPolicy",
    "Cluster",
    "ConsolidationPlan",
    "EarliestFit",
    "Host",
    "HostState",
    "Miss",
    "MultiPlacementResult",
    "NodeGroup",
    "PlacementEngine",
    "PlacementOptions",
    "PlacementResult",
    "PlannedMove",
    "Policy",
    "RebalanceOptions",
    "RebalancePlan",
    "Request",
    "Resources",
    "consolidate",
    "earliest_fit",
    "format_time",
    "place",
    "place_many",
    "rebalance",
]
