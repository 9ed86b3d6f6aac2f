"""Ganeti's vocabulary as htools 3.0 uses it: failure modes, disk templates, policies.

Contract: values and orders match Ganeti 3.0 (`Ganeti.HTools.Types`, `Ganeti.Types`),
because orders leak into results: failure counts are listed in `FailMode` order, the
default policy lists disk templates in declaration order (hspace's default template is the
first), and allocation policies sort preferred < last_resort < unallocable.
"""

from __future__ import annotations

from .records import Frozen, Record, replace

_set = object.__setattr__


class _FailModes(type):
    """What `FailMode` takes from `enum.IntEnum`: iteration in value order, ``FailMode(3)``
    and ``FailMode["N1"]`` (without importing `enum`, which the start-up cannot afford)."""

    def __iter__(cls):
        return iter(cls._members)

    def __len__(cls) -> int:
        return len(cls._members)

    def __call__(cls, value):
        if isinstance(value, int) and 0 <= value < len(cls._members):
            return cls._members[value]
        raise ValueError(f"{value!r} is not a valid FailMode")

    def __getitem__(cls, name: str):
        return cls._by_name[name]


class FailMode(int, metaclass=_FailModes):
    """Ganeti's ``FailMode``: an int (so modes sort and count in Ganeti's order) with a
    ``name`` and Ganeti's ``label``, one object per mode."""

    __slots__ = ()
    _members: tuple = ()
    _by_name: dict = {}

    @property
    def name(self) -> str:
        return _FAIL_NAMES[self]

    @property
    def value(self) -> int:
        return int(self)

    @property
    def label(self) -> str:
        """Ganeti's ``show``: FailMem, FailDisk, FailCPU, FailN1, ..."""
        return _FAIL_LABELS[self]

    def __repr__(self) -> str:
        return f"<FailMode.{self.name}: {int(self)}>"

    __str__ = int.__repr__  # as IntEnum's, from Python 3.11 on

    def __reduce__(self):
        return FailMode, (int(self),)


_FAIL_NAMES = ("MEM", "DISK", "CPU", "N1", "TAGS", "MIG", "DISKCOUNT", "SPINDLES", "INTERNAL")
_FAIL_LABELS = (
    "FailMem",
    "FailDisk",
    "FailCPU",
    "FailN1",
    "FailTags",
    "FailMig",
    "FailDiskCount",
    "FailSpindles",
    "FailInternal",
)
FailMode._members = tuple(int.__new__(FailMode, value) for value in range(len(_FAIL_NAMES)))
FailMode._by_name = dict(zip(_FAIL_NAMES, FailMode._members, strict=True))
for _mode in FailMode._members:
    setattr(FailMode, _mode.name, _mode)
del _mode


class AllocFailure(Exception):
    """A node refused an instance; ``mode`` says why (Ganeti's ``Bad FailMode``)."""

    def __init__(self, mode: FailMode) -> None:
        super().__init__(mode.label)
        self.mode = mode


#: Disk templates in Ganeti's declaration order.
DISK_TEMPLATES = (
    "diskless",
    "file",
    "sharedfile",
    "plain",
    "blockdev",
    "drbd",
    "rbd",
    "ext",
    "gluster",
)
LOCAL_STORAGE = frozenset({"drbd", "plain"})
#: Templates whose instances hbal may move (`Instance.movable` at load time).
MOVABLE = frozenset({"drbd", "blockdev", "sharedfile", "gluster", "rbd", "ext"})
#: Templates the global N+1 check may move freely instead of re-creating.
FREELY_MOVABLE = frozenset({"diskless", "sharedfile", "rbd", "ext", "gluster"})

MIRROR_NONE, MIRROR_INTERNAL, MIRROR_EXTERNAL = "none", "internal", "external"
_MIRROR = {
    "diskless": MIRROR_EXTERNAL,
    "file": MIRROR_NONE,
    "sharedfile": MIRROR_EXTERNAL,
    "plain": MIRROR_NONE,
    "blockdev": MIRROR_EXTERNAL,
    "drbd": MIRROR_INTERNAL,
    "rbd": MIRROR_EXTERNAL,
    "ext": MIRROR_EXTERNAL,
    "gluster": MIRROR_EXTERNAL,
}


def mirror_type(template: str) -> str:
    return _MIRROR[template]


def required_nodes(template: str) -> int:
    return 2 if template == "drbd" else 1


ALLOC_POLICIES = ("preferred", "last_resort", "unallocable")

#: Instance run states (raw names as in the text format and IAllocator).
RUNNING_STATES = frozenset({"running", "ERROR_up"})
OFFLINE_STATE = "ADMIN_offline"
INSTANCE_STATES = frozenset(
    {
        "running",
        "ADMIN_down",
        "ADMIN_offline",
        "ERROR_down",
        "ERROR_up",
        "ERROR_nodedown",
        "ERROR_nodeoffline",
        "ERROR_wrongnode",
        "USER_down",
    }
)

# Shrinking steps of tiered allocation (Ganeti's unitMem, unitDsk, unitCpu, unitSpindle).
UNIT_MEM = 64
UNIT_DSK = 256
UNIT_CPU = 1
UNIT_SPINDLE = 1


class ISpec(Frozen):
    __slots__ = ("mem", "cpu", "disk", "disk_count", "nic_count", "spindle_use")

    def __init__(
        self, mem: int, cpu: int, disk: int, disk_count: int = 1, nic_count: int = 1, spindle_use: int = 1
    ) -> None:
        _set(self, "mem", mem)
        _set(self, "cpu", cpu)
        _set(self, "disk", disk)
        _set(self, "disk_count", disk_count)
        _set(self, "nic_count", nic_count)
        _set(self, "spindle_use", spindle_use)

    def to_text(self) -> str:
        return ",".join(
            str(v)
            for v in (
                self.mem,
                self.cpu,
                self.disk,
                self.disk_count,
                self.nic_count,
                self.spindle_use,
            )
        )

    @classmethod
    def from_text(cls, text: str) -> ISpec:
        parts = [int(p) for p in text.split(",")]
        if len(parts) != 6:
            raise ValueError(f"invalid ispec {text!r}")
        return cls(*parts)

    def to_json(self) -> dict:
        return {
            "memory-size": self.mem,
            "cpu-count": self.cpu,
            "disk-size": self.disk,
            "disk-count": self.disk_count,
            "nic-count": self.nic_count,
            "spindle-use": self.spindle_use,
        }

    @classmethod
    def from_json(cls, data: dict) -> ISpec:
        return cls(
            data["memory-size"],
            data["cpu-count"],
            data["disk-size"],
            data.get("disk-count", 1),
            data.get("nic-count", 1),
            data.get("spindle-use", 1),
        )


DEFAULT_MIN = ISpec(128, 1, 1024, 1, 1, 1)
DEFAULT_MAX = ISpec(32768, 8, 1048576, 16, 8, 12)
DEFAULT_STD = ISpec(128, 1, 1024, 1, 1, 1)


class IPolicy(Frozen):
    __slots__ = ("minmax", "std", "disk_templates", "vcpu_ratio", "spindle_ratio")

    def __init__(
        self,
        minmax: tuple[tuple[ISpec, ISpec], ...] = ((DEFAULT_MIN, DEFAULT_MAX),),
        std: ISpec = DEFAULT_STD,
        disk_templates: tuple[str, ...] = DISK_TEMPLATES,
        vcpu_ratio: float = 4.0,
        spindle_ratio: float = 32.0,
    ) -> None:
        _set(self, "minmax", minmax)
        _set(self, "std", std)
        _set(self, "disk_templates", disk_templates)
        _set(self, "vcpu_ratio", vcpu_ratio)
        _set(self, "spindle_ratio", spindle_ratio)

    def with_vcpu_ratio(self, ratio: float) -> IPolicy:
        return replace(self, vcpu_ratio=ratio)

    def to_json(self) -> dict:
        return {
            "minmax": [{"min": lo.to_json(), "max": hi.to_json()} for lo, hi in self.minmax],
            "std": self.std.to_json(),
            "disk-templates": list(self.disk_templates),
            "vcpu-ratio": self.vcpu_ratio,
            "spindle-ratio": self.spindle_ratio,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> IPolicy:
        if not data:
            return cls()
        return cls(
            tuple((ISpec.from_json(m["min"]), ISpec.from_json(m["max"])) for m in data.get("minmax", []))
            or ((DEFAULT_MIN, DEFAULT_MAX),),
            ISpec.from_json(data["std"]) if "std" in data else DEFAULT_STD,
            tuple(data.get("disk-templates", DISK_TEMPLATES)),
            float(data.get("vcpu-ratio", 4.0)),
            float(data.get("spindle-ratio", 32.0)),
        )


DEFAULT_IPOLICY = IPolicy()


class Group(Record):
    __slots__ = ("name", "uuid", "alloc_policy", "tags", "networks", "ipolicy", "idx")

    def __init__(
        self,
        name: str,
        uuid: str,
        alloc_policy: str = "preferred",
        tags: list[str] | None = None,
        networks: list[str] | None = None,
        ipolicy: IPolicy = DEFAULT_IPOLICY,
        idx: int = 0,
    ) -> None:
        self.name = name
        self.uuid = uuid
        self.alloc_policy = alloc_policy
        self.tags = [] if tags is None else tags
        self.networks = [] if networks is None else networks
        self.ipolicy = ipolicy
        self.idx = idx

    @property
    def allocable(self) -> bool:
        return self.alloc_policy != "unallocable"
