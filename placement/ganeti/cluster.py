"""A Ganeti cluster as htools sees it: node groups, nodes, instances, tags, policy.

Contract: `GCluster` holds plain lists indexed by node/instance index. Build one with
`GCluster.build(...)` from freshly parsed nodes and instances: it does what htools' loader
does after parsing (``mergeData``/``checkData``): exclusion tags, primaries and
secondaries on their nodes, memory bookkeeping, N+1 peers, group policies, and marks
instances split across groups as immovable.
"""

from __future__ import annotations

from . import types as T
from .instance import NO_NODE, Instance
from .metrics import score
from .node import Node
from .records import Record, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

EXCLUSION_TAG_PREFIX = "htools:iextags:"


class GCluster(Record):
    __slots__ = ("groups", "nodes", "instances", "tags", "ipolicy", "name")

    def __init__(
        self,
        groups: list[T.Group],
        nodes: list[Node],
        instances: list[Instance],
        tags: list[str] | None = None,
        ipolicy: T.IPolicy = T.DEFAULT_IPOLICY,
        name: str = "cluster",
    ) -> None:
        self.groups = groups
        self.nodes = nodes
        self.instances = instances
        self.tags = [] if tags is None else tags
        self.ipolicy = ipolicy
        self.name = name

    @classmethod
    def build(
        cls,
        groups: list[T.Group],
        nodes: list[Node],
        instances: list[Instance],
        tags: Iterable[str] = (),
        ipolicy: T.IPolicy = T.DEFAULT_IPOLICY,
        exclusion_tags: Iterable[str] = (),
        ignore_dynu: bool = False,
        name: str = "cluster",
    ) -> GCluster:
        tags = list(tags)
        for i, g in enumerate(groups):
            g.idx = i
        for i, n in enumerate(nodes):
            n.idx = i
        prefixes = list(exclusion_tags) + [
            t[len(EXCLUSION_TAG_PREFIX) :] for t in tags if t.startswith(EXCLUSION_TAG_PREFIX)
        ]
        prefixes = [p for p in prefixes if p]
        for i, inst in enumerate(instances):
            inst.idx = i
            inst.excl_tags = [t for t in inst.tags if any(t.startswith(p) for p in prefixes)]
            if ignore_dynu:
                inst.extra["util"] = (0.0, 0.0, 0.0, 0.0)
        for inst in instances:
            nodes[inst.pnode].load_primary(inst)
            if inst.snode != NO_NODE:
                nodes[inst.snode].load_secondary(inst)
        for node in nodes:
            node.finish_loading(instances)
            node.set_policy(groups[node.group].ipolicy)
        for inst in instances:
            if inst.snode != NO_NODE and nodes[inst.snode].group != nodes[inst.pnode].group:
                inst.movable = False
        return cls(groups, nodes, instances, tags, ipolicy, name)

    # ------------------------------------------------------------------ lookups

    def node_index(self, name: str) -> int:
        for node in self.nodes:
            if node.name == name:
                return node.idx
        raise KeyError(f"unknown node {name!r}")

    def instance_index(self, name: str) -> int:
        for inst in self.instances:
            if inst.name == name:
                return inst.idx
        raise KeyError(f"unknown instance {name!r}")

    def group_index(self, name_or_uuid: str) -> int:
        for g in self.groups:
            if name_or_uuid in (g.name, g.uuid):
                return g.idx
        raise KeyError(f"unknown node group {name_or_uuid!r}")

    def score(self) -> float:
        return score(self.nodes)

    def replaced(self, nodes: list[Node], instances: list[Instance]) -> GCluster:
        return GCluster(self.groups, nodes, instances, self.tags, self.ipolicy, self.name)

    def clear_dynu(self) -> GCluster:
        """The same cluster with dynamic utilisation ignored (``--ignore-dynu``)."""
        return rebuild(self, ignore_dynu=True)

    def set_offline(self, names: Iterable[str]) -> GCluster:
        """``-O NODE``: mark nodes offline."""
        names = set(names)
        nodes = []
        for node in self.nodes:
            if node.name in names:
                node = node.copy()
                node.offline = True
            nodes.append(node)
        return self.replaced(nodes, self.instances)


def rebuild(cluster: GCluster, ignore_dynu: bool = False) -> GCluster:
    """Re-run the loader on fresh copies (used after changing instances wholesale)."""
    nodes = []
    for n in cluster.nodes:
        fresh = Node(
            n.name,
            n.t_mem,
            n.n_mem,
            n.f_mem,
            n.t_dsk,
            n.f_dsk,
            n.t_cpu,
            n.n_cpu,
            n.offline,
            n.t_spindles,
            n.f_spindles,
            n.group,
            n.excl_storage,
            n.cpu_speed,
            n.tags,
            n.is_master,
        )
        fresh.set_mdsk(n.m_dsk)
        nodes.append(fresh)
    instances = []
    for inst in cluster.instances:
        clone = inst.copy()
        clone.extra = {k: v for k, v in inst.extra.items() if k != "util"}
        instances.append(clone)
    groups = [replace(g) for g in cluster.groups]
    built = GCluster.build(
        groups,
        nodes,
        instances,
        cluster.tags,
        cluster.ipolicy,
        ignore_dynu=ignore_dynu,
        name=cluster.name,
    )
    for old, new in zip(cluster.nodes, built.nodes, strict=True):
        if old.vcpu_ratio != new.vcpu_ratio:
            new.set_mcpu(old.vcpu_ratio)
    return built
