"""Synthetic Ganeti clusters for tests and benchmarks (a "simulation loader").

Contract: `unbalanced_cluster(nodes, instances, seed)` returns a deterministic `GCluster`
of mixed node sizes holding DRBD (or other) instances placed with a skew towards the first
nodes, so there is something to balance. Free memory and disk are consistent with the
instances (so htools reports no missing memory).
"""

from __future__ import annotations

import random

from . import types as T
from .cluster import GCluster
from .instance import Instance
from .node import Node


def unbalanced_cluster(
    nodes: int,
    instances: int,
    seed: int = 1,
    template: str = "drbd",
    skew: float = 0.3,
    fill: float = 0.9,
) -> GCluster:
    rng = random.Random(seed)
    specs = []
    for i in range(nodes):
        specs.append(
            {
                "name": f"node{i:03d}",
                "mem": rng.choice([65536, 98304, 131072]),
                "dsk": rng.choice([1024 * 1024, 2 * 1024 * 1024]),
                "cpu": rng.choice([16, 24, 32]),
                "used_mem": 0,
                "used_dsk": 0,
            }
        )
    weights = [1.0 / (1 + i * skew) for i in range(nodes)]
    mirrored = template == "drbd"
    local = template in ("drbd", "plain")
    placed: list[Instance] = []
    for k in range(instances):
        mem = rng.choice([1024, 2048, 4096, 8192])
        dsk = rng.choice([10240, 20480, 51200, 102400])
        for _ in range(100):
            p = rng.choices(range(nodes), weights)[0]
            s = rng.randrange(nodes) if mirrored else -1
            if mirrored and s == p:
                continue
            pn = specs[p]
            if pn["used_mem"] + mem >= pn["mem"] * fill:
                continue
            if local and pn["used_dsk"] + dsk >= pn["dsk"] * fill:
                continue
            if mirrored and specs[s]["used_dsk"] + dsk >= specs[s]["dsk"] * fill:
                continue
            break
        else:
            continue
        specs[p]["used_mem"] += mem
        if local:
            specs[p]["used_dsk"] += dsk
        if mirrored:
            specs[s]["used_dsk"] += dsk
        placed.append(
            Instance(
                f"inst{k:04d}",
                mem,
                dsk,
                rng.choice([1, 2, 4]),
                "running",
                True,
                p,
                s,
                template,
                [],
                1,
            )
        )
    node_objs = [
        Node(
            n["name"],
            n["mem"],
            0,
            n["mem"] - n["used_mem"],
            n["dsk"],
            n["dsk"] - n["used_dsk"],
            n["cpu"],
            1,
            False,
            1,
            0,
            0,
        )
        for n in specs
    ]
    groups = [T.Group("default", "uuid-default", "preferred")]
    return GCluster.build(groups, node_objs, placed, name="generated")


def consistent_free_memory(cluster: GCluster) -> GCluster:
    """Rewrite each node's free memory from its running primaries (htools' saved files
    keep the free memory they were loaded with, so after moves it is stale)."""
    nodes = []
    for old in cluster.nodes:
        node = old.copy()
        used = sum(cluster.instances[i].mem for i in node.plist if cluster.instances[i].uses_memory)
        node.f_mem = int(node.t_mem) - node.n_mem - used
        node.x_mem = int(node.t_mem) - node.n_mem - node.f_mem - node.i_mem
        nodes.append(node)
    return cluster.replaced(nodes, cluster.instances)
