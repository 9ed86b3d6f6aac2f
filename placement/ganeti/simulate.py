"""Simulated clusters (hspace/hail ``--simulate``) and htools' unit parsing.

Contract: `parse_unit("1t") == 1048576` (MiB; binary m/g/t or MiB/GiB/TiB, SI M/G/T or
MB/GB/TB) and `simulated_cluster(["p,3,34052480,65523,24"])` builds exactly the cluster
htools builds: per spec one node group of identical nodes with no node memory overhead,
one vCPU reserved for the node OS, the given spindles (default 1), default policies. As
with htools' repeated option, the *last* spec becomes ``group-01``.
"""

from __future__ import annotations

from . import types as T
from .cluster import GCluster
from .node import Node

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

#: Unit -> MiB as (numerator, denominator): integer arithmetic, truncated like htools.
_MIB = (1, 1)
_GIB = (1024, 1)
_TIB = (1024 * 1024, 1)
_MB = (1000 * 1000, 1024 * 1024)  # 1 MB in MiB


def parse_unit(text: str) -> int:
    value, unit = _number_and_unit(text)
    if unit in ("", "m") or unit.upper() == "MIB":
        scale = _MIB
    elif unit == "g" or unit.upper() == "GIB":
        scale = _GIB
    elif unit == "t" or unit.upper() == "TIB":
        scale = _TIB
    elif unit == "M" or unit.upper() == "MB":
        scale = _MB
    elif unit == "G" or unit.upper() == "GB":
        scale = (_MB[0] * 1000, _MB[1])
    elif unit == "T" or unit.upper() == "TB":
        scale = (_MB[0] * 1000 * 1000, _MB[1])
    else:
        raise ValueError(f"Unknown unit '{unit}'")
    whole = abs(value) * scale[0] // scale[1]  # truncated toward zero, as math.trunc
    return -whole if value < 0 else whole


def _number_and_unit(text: str) -> tuple[int, str]:
    """``\\s*(-?\\d+)\\s*([A-Za-z]*)\\s*`` matched by hand (`re` costs start-up time)."""
    rest = text.strip()
    sign = ""
    if rest.startswith("-"):
        sign, rest = "-", rest[1:]
    end = 0
    while end < len(rest) and rest[end].isdecimal():
        end += 1
    unit = rest[end:].lstrip()
    if not end or unit and not (unit.isascii() and unit.isalpha()):
        raise ValueError(f"Can't parse string '{text}'")
    return int(sign + rest[:end]), unit


_POLICY_ABBREV = {"p": "preferred", "a": "last_resort", "u": "unallocable"}


def parse_spec(spec: str) -> tuple[str, int, int, int, int, int, bool]:
    parts = spec.split(",")
    if len(parts) == 5:
        parts.append("1")
    if len(parts) == 6:
        parts.append("False")
    if len(parts) != 7:
        raise ValueError(
            "Invalid cluster specification, expected 6 comma-separated sections (allocation"
            f" policy, node count, disk size, memory size, number of CPUs, spindles) but got"
            f" {len(parts)}: '{spec}'"
        )
    policy = _POLICY_ABBREV.get(parts[0], parts[0])
    if policy not in T.ALLOC_POLICIES:
        raise ValueError(f"Cannot parse AllocPolicy abbreviation '{parts[0]}'")
    excl = parts[6].strip()
    if excl not in ("True", "False"):
        raise ValueError(f"exclusive storage: cannot parse '{excl}'")
    count = _integer(parts[1], "node count", spec)
    disk = parse_unit(parts[2])
    mem = parse_unit(parts[3])
    cpus = _integer(parts[4], "number of CPUs", spec)
    spindles = _integer(parts[5], "spindles", spec)
    # htools answers nonsense (or loops) for these; we refuse them up front.
    for value, what in (
        (count, "node count"),
        (disk, "disk size"),
        (mem, "memory size"),
        (cpus, "number of CPUs"),
        (spindles, "spindles"),
    ):
        if value < 1:
            raise ValueError(f"{what} must be at least 1, got {value} in '{spec}'")
    return (policy, count, disk, mem, cpus, spindles, excl == "True")


def _integer(text: str, what: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what}: cannot parse '{text}' as an integer in '{spec}'") from None


def simulated_cluster(specs: Sequence[str]) -> GCluster:
    """``specs`` in command-line order (the last one becomes group-01, as in htools)."""
    groups: list[T.Group] = []
    nodes: list[Node] = []
    for gnum, spec in enumerate(reversed(list(specs)), start=1):
        policy, count, disk, mem, cpu, spindles, excl = parse_spec(spec)
        groups.append(T.Group(f"group-{gnum:02d}", f"fake-uuid-{gnum:02d}", policy))
        for n in range(1, count + 1):
            nodes.append(
                Node(
                    f"node-{gnum:02d}-{n:03d}",
                    mem,
                    0,
                    mem,
                    disk,
                    disk,
                    cpu,
                    1,
                    False,
                    spindles,
                    0,
                    gnum - 1,
                    excl,
                    is_master=(gnum == 1 and n == 1),
                )
            )
    return GCluster.build(groups, nodes, [], [], T.DEFAULT_IPOLICY)
