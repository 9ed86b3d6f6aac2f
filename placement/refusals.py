"""Why a host was rejected: stable reason codes and how to say them.

Contract: a reason is a short string code (stable, used as a JSON key); ``lacks_<name>`` is
generated for every resource, so extras need no registration. Each rejected host is counted
once, under the first check it failed, in the order of `CHECK_ORDER`.
"""

from __future__ import annotations

from collections.abc import Mapping

OFFLINE = "offline"
DRAINED = "drained"
RETIRING = "retiring"
GROUP_UNALLOCATABLE = "group_unallocatable"
NOT_IN_GROUP = "not_in_group"
WRONG_HYPERVISOR = "wrong_hypervisor"
MISSING_TAG = "missing_tag"
FORBIDDEN_TAG = "forbidden_tag"
EXCLUSIVE_STORAGE = "exclusive_storage"
OFF_OVERLAY = "off_overlay"
ANTI_AFFINITY = "anti_affinity"
MAX_VMS = "max_vms"
EXTERNAL_REFUSED = "external_refused"
NOT_FREE = "not_free"

#: The order checks run in; a host is counted under the first one it fails.
CHECK_ORDER = (
    OFFLINE,
    DRAINED,
    RETIRING,
    GROUP_UNALLOCATABLE,
    NOT_IN_GROUP,
    WRONG_HYPERVISOR,
    MISSING_TAG,
    FORBIDDEN_TAG,
    EXCLUSIVE_STORAGE,
    OFF_OVERLAY,
    ANTI_AFFINITY,
    MAX_VMS,
    # then lacks_<resource>, in resource-space order
)

_PHRASES = {
    OFFLINE: "offline",
    DRAINED: "drained",
    RETIRING: "leaving service before the end",
    GROUP_UNALLOCATABLE: "in an unallocatable group",
    NOT_IN_GROUP: "outside the requested groups",
    WRONG_HYPERVISOR: "wrong hypervisor type",
    MISSING_TAG: "missing a required tag",
    FORBIDDEN_TAG: "carry a forbidden tag",
    OFF_OVERLAY: "not on the overlay network",
    EXCLUSIVE_STORAGE: "lack exclusive storage",
    ANTI_AFFINITY: "anti-affinity conflict",
    MAX_VMS: "at their VM limit",
    EXTERNAL_REFUSED: "refused by the external allocator",
    NOT_FREE: "never free enough in time",
}

_RESOURCE_WORDS = {"vcpus": "vcpus", "memory_mib": "memory", "disk_gib": "disk"}


def lacks(resource: str) -> str:
    """The reason code for "not enough <resource>"."""
    return MAX_VMS if resource == "vms" else f"lacks_{resource}"


def phrase(code: str) -> str:
    """Human words for a reason code: ``lacks_memory_mib`` → ``lack memory``."""
    if code in _PHRASES:
        return _PHRASES[code]
    if code.startswith("lacks_"):
        name = code[len("lacks_") :]
        if name.startswith("gpu:"):
            return f"lack GPU {name[len('gpu:') :]}"
        return f"lack {_RESOURCE_WORDS.get(name, name)}"
    return code.replace("_", " ")


def summarize(counts: Mapping[str, int]) -> str:
    """``212 lack memory, 30 drained`` — largest first, ties in check order."""
    order = {code: i for i, code in enumerate(CHECK_ORDER)}
    items = sorted(
        ((code, n) for code, n in counts.items() if n),
        key=lambda item: (-item[1], order.get(item[0], len(order)), item[0]),
    )
    return ", ".join(f"{n} {phrase(code)}" for code, n in items)
