"""Ganeti htools' text backend (``hbal -t FILE``, ``hspace -S``): parse and write.

Contract: `parse(text) -> GCluster` and `serialize(cluster) -> str` round-trip the htools
3.0 format: ``|``-separated lines in five sections (groups, nodes, instances, cluster tags,
instance policies) separated by exactly one empty line; an empty section is an extra empty
line. Older, shorter node and instance lines are accepted with htools' defaults.

- group:    ``name|uuid|alloc_policy|tags|networks``
- node:     ``name|t_mem|n_mem|f_mem|t_dsk|f_dsk|t_cpu|role|group_uuid|spindles|tags|``
            ``excl_storage|free_spindles|os_vcpus|cpu_speed`` (role N, M=master, Y=offline)
- instance: ``name|mem|dsk|vcpus|status|auto_balance|pnode|snode|template|tags|``
            ``spindle_use|spindles|forthcoming``
- ipolicy:  ``owner|std|min;max[;min;max…]|templates|vcpu_ratio|spindle_ratio`` (owner
            empty = cluster, else the group's name; specs ``mem,cpu,disk,disks,nics,spindles``)
"""

from __future__ import annotations

from . import types as T
from .cluster import GCluster
from .hsformat import show_double
from .instance import NO_NODE, Instance
from .node import Node


class TextFormatError(ValueError):
    pass


def sep_split(sep, items: list) -> list[list]:
    """Haskell htools' ``sepSplit``: ``a,,b`` → ``[a, '', b]``; an empty input → ``[]``."""
    if not items:
        return []
    out: list[list] = []
    current: list = []
    for item in items:
        if item == sep:
            out.append(current)
            current = []
        else:
            current.append(item)
    out.append(current)
    return out


def _fields(line: str) -> list[str]:
    return line.split("|")


def _tags(text: str) -> list[str]:
    return [t for t in text.split(",") if t] if text else []


def parse(text: str, ignore_dynu: bool = False) -> GCluster:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # a final newline ends the last line, it is not an empty line
    sections = sep_split("", lines)
    if len(sections) == 4:
        sections.append([])
    if len(sections) != 5:
        raise TextFormatError(f"Invalid format of the input file: {len(sections)} sections instead of 4 or 5")
    glines, nlines, ilines, ctags, pollines = sections
    groups: list[T.Group] = []
    by_uuid: dict[str, int] = {}
    for line in glines:
        f = _fields(line)
        if len(f) < 3:
            raise TextFormatError(f"Invalid/incomplete group data: {line!r}")
        policy = f[2]
        if policy not in T.ALLOC_POLICIES:
            raise TextFormatError(f"Invalid alloc policy {policy!r} for group {f[0]}")
        group = T.Group(f[0], f[1], policy, _tags(f[3]) if len(f) > 3 else [])
        if len(f) > 4:
            group.networks = _tags(f[4])
        by_uuid[group.uuid] = len(groups)
        groups.append(group)
    nodes = [_parse_node(line, by_uuid) for line in nlines]
    node_index = {n.name: i for i, n in enumerate(nodes)}
    instances = [_parse_instance(line, node_index) for line in ilines]
    cluster_policy = T.DEFAULT_IPOLICY
    for line in pollines:
        owner, ipol = _parse_ipolicy(line)
        if owner == "":
            cluster_policy = ipol
        else:
            for g in groups:
                if g.name == owner:
                    g.ipolicy = ipol
                    break
            else:
                raise TextFormatError(f"policy for unknown group {owner!r}")
    return GCluster.build(groups, nodes, instances, [t for t in ctags if t], cluster_policy, ignore_dynu=ignore_dynu)


def _parse_node(line: str, by_uuid: dict[str, int]) -> Node:
    f = _fields(line)
    if len(f) < 9:
        raise TextFormatError(f"Invalid/incomplete node data: {line!r}")
    defaults = ["1", "", "N", "0", "1", "1.0"]
    f = f + defaults[len(f) - 9 :] if len(f) < 15 else f
    name, tm, nm, fm, td, fd, tc, role, guuid, spindles, tags, excl, fsp, ncpu, speed = f[:15]
    if guuid not in by_uuid:
        raise TextFormatError(f"Unknown group {guuid!r} for node {name}")
    offline = role in ("Y", "D")
    try:
        if "?" in (tm, nm, fm, td, fd, tc):
            node = Node(name, 0, 0, 0, 0, 0, 0, 1, True, 0, 0, by_uuid[guuid])
        else:
            node = Node(
                name,
                float(tm),
                int(nm),
                int(fm),
                float(td),
                int(fd),
                float(tc),
                int(ncpu),
                offline,
                int(spindles),
                int(fsp),
                by_uuid[guuid],
                excl == "Y",
                float(speed),
                _tags(tags),
                role == "M",
            )
    except ValueError as exc:
        raise TextFormatError(f"node {name}: {exc}") from exc
    return node


def _parse_instance(line: str, node_index: dict[str, int]) -> Instance:
    f = _fields(line)
    if len(f) < 10:
        raise TextFormatError(f"Invalid/incomplete instance data: {line!r}")
    f = f + ["1", "", "N"][len(f) - 10 :] if len(f) < 13 else f
    name, mem, dsk, vcpus, status, auto_bal, pnode, snode, template, tags, su, spn, forth = f[:13]
    if pnode not in node_index:
        raise TextFormatError(f"Unknown node '{pnode}' for instance {name}")
    if snode and snode not in node_index:
        raise TextFormatError(f"Unknown node '{snode}' for instance {name}")
    if auto_bal not in ("Y", "N"):
        raise TextFormatError(f"Invalid auto_balance value '{auto_bal}' for instance {name}")
    if template not in T.DISK_TEMPLATES:
        raise TextFormatError(f"Instance {name}: unknown disk template {template!r}")
    if status not in T.INSTANCE_STATES:
        raise TextFormatError(f"Instance {name}: unknown status {status!r}")
    pidx = node_index[pnode]
    sidx = node_index[snode] if snode else NO_NODE
    if sidx == pidx:
        raise TextFormatError(f"Instance {name} has same primary and secondary node - {pnode}")
    try:
        size = int(dsk)
        spindles = int(spn) if spn not in ("", "-") else None
        return Instance(
            name,
            int(mem),
            size,
            int(vcpus),
            status,
            auto_bal == "Y",
            pidx,
            sidx,
            template,
            _tags(tags),
            int(su),
            [(size, spindles)],
            forth == "Y",
        )
    except ValueError as exc:
        raise TextFormatError(f"instance {name}: {exc}") from exc


def _parse_ipolicy(line: str) -> tuple[str, T.IPolicy]:
    f = _fields(line)
    if len(f) != 6:
        raise TextFormatError(f"Invalid ipolicy data: {line!r}")
    owner, std, minmax, templates, vcpu_ratio, spindle_ratio = f
    specs = minmax.split(";")
    if len(specs) % 2:
        raise TextFormatError(f"Odd number of min/max specs for {owner}")
    pairs = [(T.ISpec.from_text(specs[i]), T.ISpec.from_text(specs[i + 1])) for i in range(0, len(specs), 2)]
    return owner, T.IPolicy(
        tuple(pairs),
        T.ISpec.from_text(std),
        tuple(t for t in templates.split(",") if t),
        float(vcpu_ratio),
        float(spindle_ratio),
    )


# --------------------------------------------------------------------- writing


def serialize(cluster: GCluster) -> str:
    groups = "".join(_group_line(g) + "\n" for g in cluster.groups)
    nodes = "".join(_node_line(cluster, n) + "\n" for n in cluster.nodes)
    insts = "".join(_instance_line(cluster, i) + "\n" for i in cluster.instances)
    tags = "".join(t + "\n" for t in cluster.tags)
    policies = _policy_line("", cluster.ipolicy) + "\n"
    policies += "".join(_policy_line(g.name, g.ipolicy) + "\n" for g in cluster.groups)
    # Not "\n".join of lines: sections are separated by exactly one empty line.
    return "\n".join([groups, nodes, insts, tags, policies])


def _group_line(g: T.Group) -> str:
    return "|".join([g.name, g.uuid, g.alloc_policy, ",".join(g.tags), ",".join(g.networks)])


def _node_line(cluster: GCluster, n: Node) -> str:
    role = "Y" if n.offline else ("M" if n.is_master else "N")
    return "|".join(
        [
            n.name,
            f"{n.t_mem:.0f}",
            str(n.n_mem),
            str(n.f_mem),
            f"{n.t_dsk:.0f}",
            str(n.f_dsk),
            f"{n.t_cpu:.0f}",
            role,
            cluster.groups[n.group].uuid,
            str(n.t_spindles),
            ",".join(n.tags),
            "Y" if n.excl_storage else "N",
            str(n.f_spindles),
            str(n.n_cpu),
            show_double(n.cpu_speed),
        ]
    )


def _instance_line(cluster: GCluster, i: Instance) -> str:
    spindles = i.total_spindles()
    return "|".join(
        [
            i.name,
            str(i.mem),
            str(i.dsk),
            str(i.vcpus),
            i.status,
            "Y" if i.auto_balance else "N",
            cluster.nodes[i.pnode].name,
            "" if i.snode == NO_NODE else cluster.nodes[i.snode].name,
            i.disk_template,
            ",".join(i.tags),
            str(i.spindle_use),
            "-" if spindles is None else str(spindles),
            "Y" if i.forthcoming else "N",
        ]
    )


def _policy_line(owner: str, p: T.IPolicy) -> str:
    minmax = ";".join(f"{lo.to_text()};{hi.to_text()}" for lo, hi in p.minmax)
    return "|".join(
        [
            owner,
            p.std.to_text(),
            minmax,
            ",".join(p.disk_templates),
            show_double(p.vcpu_ratio),
            show_double(p.spindle_ratio),
        ]
    )
