"""Rows → the placement core's data. The only place that knows both sides.

Reads with ``values_list`` (no model instances): a snapshot of 10,000 hosts and 100,000
allocations has to load in about a second.
"""

from collections import defaultdict

from django.contrib.contenttypes.models import ContentType
from django.db.models import Q
from taggit.models import TaggedItem

import placement as core
from capacity.models import Allocation
from inventory.devices import gpu_counts
from inventory.models import Hypervisor, NodeGroup
from placement import devices as core_devices

DEFAULT_GROUP = "default"

HOST_COLUMNS = (
    "id", "name", "state", "driver", "group__name", "group__exclusive_storage",
    "cpus", "memory_mib", "disk_gib", "cpu_ratio", "memory_ratio", "disk_ratio",
    "reserved_cpus", "reserved_memory_mib", "reserved_disk_gib", "max_vms", "spindles", "scheduled_until", "devices",
    "overlay",
)  # fmt: skip
ALLOCATION_COLUMNS = ("id", "host_id", "vcpus", "memory_mib", "disk_gib", "extras", "start", "end", "anti_affinity")


def ts(moment):
    """A datetime as the core's epoch seconds (None stays None: open-ended)."""
    return None if moment is None else moment.timestamp()


def allocation_from_row(row, now=None):
    """The core's allocation of a row. A claim still held after its end (``end`` ≤ ``now``: its
    VM is not gone yet, so it is not released) holds its room open-ended until it is released."""
    alloc_id, _host, vcpus, memory, disk, extras, start, end, anti = row
    overdue = now is not None and end is not None and end <= now
    return core.Allocation(
        id=str(alloc_id),
        resources=core.Resources(vcpus, memory, disk, extras or {}),
        start=ts(start),
        end=None if overdue else ts(end),
        anti_affinity=anti or None,
    )


def live_allocations(now, host_ids=None):
    """Allocations that still matter: every one not released — over by ``now`` or not, because
    a claim is released only when its VM is gone (``allocation_from_row`` keeps it open)."""
    rows = Allocation.objects.filter(released__isnull=True)
    if host_ids is not None:
        rows = rows.filter(host_id__in=host_ids)
    return rows.values_list(*ALLOCATION_COLUMNS)


def allocation_changes(after_id, released_since, now=None):
    """Rows a snapshot may have missed: ids above ``after_id``, rows released since
    ``released_since`` and (with ``now``) live rows whose end passed since then, each as
    ``ALLOCATION_COLUMNS + (released,)``, unordered.

    One round trip on two indexes (primary key, ``allocation_live``); whether a row is
    still live is decided by the caller, so the planner is never asked to combine the
    live filter with the id range (it would scan every live row)."""
    changed = Q(id__gt=after_id) | Q(released__gte=released_since)
    if now is not None:
        changed |= Q(released__isnull=True, end__gte=released_since, end__lte=now)
    rows = Allocation.objects.filter(changed).order_by()
    return rows.values_list(*ALLOCATION_COLUMNS, "released")


def host_tag_rows():
    return TaggedItem.objects.filter(content_type=ContentType.objects.get_for_model(Hypervisor))


def host_tags(host_ids=None):
    rows = host_tag_rows()
    if host_ids is not None:
        rows = rows.filter(object_id__in=host_ids)
    tags = defaultdict(set)
    for object_id, name in rows.values_list("object_id", "tag__name"):
        tags[int(object_id)].add(name)
    return tags


def host_from_row(row, tags, allocations):
    (
        _id,
        name,
        state,
        driver,
        group,
        exclusive,
        cpus,
        memory,
        disk,
        cpu_ratio,
        memory_ratio,
        disk_ratio,
        reserved_cpus,
        reserved_memory,
        reserved_disk,
        max_vms,
        spindles,
        until,
        devices,
        overlay,
    ) = row
    return core.Host(
        name=name,
        total=core.Resources(cpus, memory, disk, core_devices.gpus(gpu_counts(devices))),
        reserved=core.Resources(reserved_cpus, reserved_memory, reserved_disk),
        overcommit={"vcpus": cpu_ratio, "memory_mib": memory_ratio, "disk_gib": disk_ratio},
        state=core.HostState(state),
        group=group or DEFAULT_GROUP,
        hypervisor=Hypervisor.HV_TYPES.get(driver, driver),
        tags=frozenset(tags),
        exclusive_storage=bool(exclusive),
        max_vms=max_vms,
        spindles=spindles or 1,
        allocations=tuple(allocations),
        available_until=ts(until),
        overlay=overlay or None,
    )


def load_host(host_id, now, lock=False, tags=True):
    """One host as a single-host cluster (the re-check of a claim); ``lock`` takes its row
    lock first (inside the caller's transaction); ``tags=False`` skips reading its tags
    (when the request has no tag rules). Returns None when the host is gone."""
    rows = Hypervisor.objects.filter(pk=host_id)
    if lock:
        rows = rows.select_for_update(of=("self",))
    row = rows.values_list(*HOST_COLUMNS, "group__alloc_policy", "group__placement_policy").first()
    if row is None:
        return None
    allocations = [allocation_from_row(a, now) for a in live_allocations(now, [host_id])]
    names = host_tags([host_id]).get(host_id, ()) if tags else ()
    host = host_from_row(row[: len(HOST_COLUMNS)], names, allocations)
    alloc_policy, policy = row[len(HOST_COLUMNS) :]
    group = core.NodeGroup(host.group, core.AllocPolicy(alloc_policy or "preferred"), core.Policy(policy or "balanced"))
    return core.Cluster((host,), (group,), now=ts(now))


def node_groups():
    groups = [core.NodeGroup(DEFAULT_GROUP)]
    for group in NodeGroup.objects.all():
        groups.append(
            core.NodeGroup(
                group.name,
                core.AllocPolicy(group.alloc_policy),
                core.Policy(group.placement_policy),
                iallocator=group.iallocator_command(),
            )
        )
    return tuple(groups)


def load_cluster(now, host_ids=None):
    """A snapshot of every host (or of ``host_ids``) with its live allocations.

    Returns ``(cluster, ids)`` where ``ids`` maps host name → Hypervisor id.
    """
    per_host = defaultdict(list)
    for row in live_allocations(now, host_ids):
        per_host[row[1]].append(allocation_from_row(row, now))
    tags = host_tags(host_ids)
    rows = Hypervisor.objects.all()
    if host_ids is not None:
        rows = rows.filter(id__in=host_ids)
    hosts, ids = [], {}
    for row in rows.values_list(*HOST_COLUMNS):
        hosts.append(host_from_row(row, tags.get(row[0], ()), per_host.get(row[0], ())))
        ids[row[1]] = row[0]
    return core.Cluster(tuple(hosts), node_groups(), now=ts(now)), ids


def hypervisor_types_for(formats):
    """The hypervisor types whose variants are in one of ``formats`` (None = any): a plan for an
    image known only by its formats. The simulator's variants come in any format, so a format
    says nothing of it: it is in only when it runs any image (``drivers.registry.runs_any_image``)."""
    if formats is None:
        return None
    formats = set(formats)
    return frozenset(hv_type for hv_type, accepted in Hypervisor.IMAGE_FORMATS.items() if formats & set(accepted or ()))
