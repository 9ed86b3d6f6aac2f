"""Seeded Ganeti clusters with every case the node checks branch on, for the tests that
hold the vectorised and scratch forms of a check to the scalar one (`node.pri_added`,
`node.sec_added`): exclusive storage with spindles, exclusion tags, offline nodes and
instances, forthcoming instances, memory overhead, and drbd, plain, diskless and ext."""

import random

from placement.ganeti import text_backend
from placement.ganeti import types as T
from placement.ganeti.cluster import GCluster
from placement.ganeti.instance import Instance
from placement.ganeti.node import Node

TEMPLATES = ["drbd", "drbd", "plain", "diskless", "ext"]
STATES = ["running", "running", "running", "ADMIN_down", "ADMIN_offline"]


def varied_cluster(seed: int, nodes: int = 8, instances: int = 40) -> GCluster:
    rng = random.Random(seed)
    node_objs = []
    for i in range(nodes):
        excl = rng.random() < 0.3
        mem = rng.choice([16384, 32768, 65536])
        node_objs.append(
            Node(
                f"node{i:02d}",
                mem,
                rng.choice([0, 512]),
                mem,
                rng.choice([200 * 1024, 1024 * 1024]),
                0,
                rng.choice([4, 8, 16]),
                rng.choice([1, 2]),
                offline=rng.random() < 0.15,
                spindles=rng.choice([1, 4, 12]) if excl else 1,
                free_spindles=0,
                excl_storage=excl,
                tags=["rack:a"] if i % 2 else [],
            )
        )
    placed = []
    for k in range(instances):
        template = rng.choice(TEMPLATES)
        p = rng.randrange(nodes)
        s = rng.choice([n for n in range(nodes) if n != p]) if template == "drbd" else -1
        dsk = rng.choice([1024, 10240, 51200])
        placed.append(
            Instance(
                f"inst{k:03d}",
                rng.choice([512, 2048, 8192]),
                0 if template == "diskless" else dsk,
                rng.choice([1, 2, 4]),
                rng.choice(STATES),
                rng.random() < 0.8,
                p,
                s,
                template,
                rng.choice([[], [], ["service:web"], ["service:db"]]),
                rng.choice([1, 2]),
                [] if template == "diskless" else [(dsk, rng.choice([1, 2]) if rng.random() < 0.8 else None)],
                forthcoming=rng.random() < 0.15,
            )
        )
    _fill_free(node_objs, placed, rng)
    groups = [T.Group("default", "uuid-default", "preferred")]
    cluster = GCluster.build(groups, node_objs, placed, tags=["htools:iextags:service"], name="varied")
    # Through the text backend, as the loaders see clusters.
    return text_backend.parse(text_backend.serialize(cluster))


def _fill_free(nodes, instances, rng) -> None:
    """Free memory, disk and spindles as the instances leave them, some nodes with
    memory unaccounted for (x_mem) and a few overfull (htools loads those as they are)."""
    used_mem = [0] * len(nodes)
    used_dsk = [0] * len(nodes)
    used_sp = [0] * len(nodes)
    for inst in instances:
        sides = [inst.pnode] + ([inst.snode] if inst.snode >= 0 else [])
        if inst.running and not inst.forthcoming:
            used_mem[inst.pnode] += inst.mem
        if inst.local_storage and not inst.forthcoming:
            for n in sides:
                used_dsk[n] += inst.dsk
                used_sp[n] += inst.total_spindles() or 0
    for i, node in enumerate(nodes):
        node.f_mem = node.f_mem_forth = max(0, int(node.t_mem) - node.n_mem - used_mem[i] - rng.choice([0, 0, 1024]))
        node.f_dsk = node.f_dsk_forth = max(0, int(node.t_dsk) - used_dsk[i])
        free_sp = node.t_spindles - used_sp[i] if node.excl_storage else 0
        node.f_spindles = node.f_spindles_forth = free_sp


def probe(rng, template: str, forthcoming: bool = False) -> Instance:
    """A new instance to try on the nodes."""
    dsk = rng.choice([0, 1024, 10240, 102400, 10**7]) if template != "diskless" else 0
    inst = Instance(
        "probe",
        rng.choice([128, 1024, 4096, 16384, 60000]),
        dsk,
        rng.choice([1, 2, 8, 32]),
        rng.choice(STATES),
        rng.random() < 0.8,
        -1,
        -1,
        template,
        rng.choice([[], ["service:web"], ["service:db"]]),
        rng.choice([1, 4, 40]),
        [] if template == "diskless" else [(dsk, rng.choice([1, 3, None]))],
        forthcoming=forthcoming,
    )
    inst.excl_tags = list(inst.tags)
    return inst


def stats(cluster: GCluster) -> dict:
    """What a generated cluster covers (the tests assert each case occurs)."""
    insts = cluster.instances
    return {
        "exclusive": sum(n.excl_storage for n in cluster.nodes),
        "offline_nodes": sum(n.offline for n in cluster.nodes),
        "forthcoming": sum(i.forthcoming for i in insts),
        "tagged": sum(bool(i.excl_tags) for i in insts),
        "offline_instances": sum(i.offline for i in insts),
        "overhead": sum(n.x_mem > 0 for n in cluster.nodes),
    }
