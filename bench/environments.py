"""Environment placement benchmark: several VMs placed all or nothing, joined on one host.

    python bench/environments.py            # 1,000 three-machine environments on 2,000 hosts
    python bench/environments.py --smoke    # tiny sizes, seconds: does it still run?

Each environment is a gang (``placement.place_gang``) of three machines of one window on one
private network, so all three share a host (the way a template's networks join its machines). The hosts
already hold time-windowed allocations (``_placement_workloads.big_cluster``). Each decision
is recorded (``commit``), so later environments see the earlier ones. Pure core: the
database claim (``capacity.claim_gang``) is one short transaction per machine on top.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import _placement_workloads as work  # noqa: E402
from bench.placement_core import percentile, table  # noqa: E402
from placement import Gang, PlacementEngine, PlacementOptions, place_gang  # noqa: E402


def gangs(n: int, now: float) -> list[Gang]:
    """``n`` environments: three machines each (the sizes of the workload's images), one window."""
    out = []
    asks = work.requests(3 * n, now, prefix="m")
    for i in range(n):
        three = asks[3 * i : 3 * i + 3]
        window = {"start": three[0].start, "end": three[0].end}
        members = tuple(replace(m, id=f"env{i}:{name}", **window) for m, name in zip(three, "abc", strict=True))
        out.append(Gang(members=members, together=(frozenset(m.id for m in members),), id=f"env{i}"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    hosts, allocations, environments = (50, 200, 40) if args.smoke else (2000, 20000, 1000)
    cluster = work.big_cluster(hosts, allocations)
    engine = PlacementEngine(cluster, PlacementOptions(default_policy="balanced"))
    engine.warm()
    timings, placed, refused_timings = [], 0, []
    for gang in gangs(environments, cluster.now):
        t0 = time.perf_counter()
        result = place_gang(engine, gang, commit=True)
        spent = time.perf_counter() - t0
        (timings if result.ok else refused_timings).append(spent)
        placed += result.ok
    every = timings + refused_timings
    rows = [
        [
            f"{environments:,} × 3 machines",
            f"{hosts:,} hosts, {allocations:,} allocations",
            f"{placed:,}",
            f"{percentile(every, 50) * 1000:.2f}",
            f"{percentile(every, 99) * 1000:.2f}",
            f"{statistics.mean(every) * 1000:.2f}",
        ]
    ]
    table(
        "environment placement (pure core, one decision per environment, recorded)",
        ["environments", "cluster", "placed", "p50 ms", "p99 ms", "mean ms"],
        rows,
    )
    if refused_timings:
        print(f"refused: {len(refused_timings)} (each with its earliest start for all: p50 "
              f"{percentile(refused_timings, 50) * 1000:.1f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
