"""vclmgr's rows as Ganeti's RAPI resources, with the field names and types of ``rlib2.py``.

Nodes are hypervisors (role ``R``/``D``/``O`` for online/drained/offline; vclmgr itself, not a
hypervisor, is the master), groups are node groups plus the implicit ``default`` one, instances
are VMs (destroyed ones are gone, as removed Ganeti instances are), jobs are jobs with one
opcode each. Sizes are MiB; times are seconds since the epoch (``[seconds, microseconds]`` in
jobs); uuids are derived from the row ids, so they are stable.
"""

import socket
import uuid
from collections import defaultdict

from django.db.models import Q, Sum
from django.utils import timezone

from accounts import access
from capacity.models import Allocation
from inventory.models import Hypervisor, NodeGroup
from jobs.models import Job
from placement.ganeti import types as ganeti_types
from provisioning.models import VM
from rapi.protocol import RapiError

_NS = uuid.UUID("5a1d3c1e-7f2b-4c55-9d0e-6b7e1c2a9f40")
DEFAULT_GROUP = "default"
ROLES = {Hypervisor.State.ONLINE: "R", Hypervisor.State.DRAINED: "D", Hypervisor.State.OFFLINE: "O"}
ROLE_NAMES = {"R": "regular", "D": "drained", "O": "offline"}
OP_IDS = {
    "vm.create": "OP_INSTANCE_CREATE",
    "vm.destroy": "OP_INSTANCE_REMOVE",
    "vm.migrate": "OP_INSTANCE_MIGRATE",
    "vm.start": "OP_INSTANCE_STARTUP",
    "vm.stop": "OP_INSTANCE_SHUTDOWN",
    "instance.rename": "OP_INSTANCE_RENAME",
    "vm.resize": "OP_INSTANCE_SET_PARAMS",
    "group.modify": "OP_GROUP_SET_PARAMS",
    "instance.multi_alloc": "OP_INSTANCE_MULTI_ALLOC",
    "group.assign_nodes": "OP_GROUP_ASSIGN_NODES",
    "node.evacuate": "OP_NODE_EVACUATE",
    "node.set_role": "OP_NODE_SET_PARAMS",
    "tags.set": "OP_TAGS_SET",
    "tags.delete": "OP_TAGS_DEL",
    "cluster.verify": "OP_CLUSTER_VERIFY",
}


def _uuid(kind, pk):
    return str(uuid.uuid5(_NS, f"{kind}:{pk}"))


def _epoch(when):
    return when.timestamp() if when else None


def _ts(when):
    """Ganeti's job timestamps: ``[seconds, microseconds]``."""
    if when is None:
        return None
    seconds = when.timestamp()
    return [int(seconds), when.microsecond]


def master_name():
    """vclmgr's own host: the cluster's master is the manager, never one of its hypervisors."""
    return socket.gethostname()


# --- names ----------------------------------------------------------------------------


def instance_name(vm):
    return vm.name or vm.key


def live_vms(user):
    """Ganeti's instances: VMs placed on a host (a Ganeti instance always has a primary node,
    and exists once its create placed it) and not destroyed."""
    vms = VM.objects.exclude(state=VM.State.DESTROYED).filter(host__isnull=False)
    return vms if access.can(user, "see_all") else vms.filter(owner=user)


def find_instance(user, name):
    """The VM a Ganeti name means: its key (``vcl-12``) or its name; 404 if none the user sees."""
    vms = live_vms(user).select_related("host", "image")
    if name.startswith("vcl-") and name[4:].isdigit():
        found = list(vms.filter(Q(pk=int(name[4:])) | Q(name=name))[:2])
    else:
        found = list(vms.filter(name=name)[:2])
    if not found:
        raise RapiError(404, f"Instance '{name}' not known")
    if len(found) > 1:
        raise RapiError(409, f"Several instances are named '{name}'; use its key ({found[0].key} …)")
    return found[0]


def find_node(name):
    host = Hypervisor.objects.select_related("group").filter(name__iexact=name).first()
    if host is None:
        raise RapiError(404, f"Node '{name}' not known")
    return host


# --- nodes ----------------------------------------------------------------------------


def _used_now(hosts):
    """Per host id: vcpus, memory and disk that claims hold at this moment."""
    now = timezone.now()
    rows = (
        Allocation.objects.filter(host__in=hosts, released__isnull=True, start__lte=now)
        .filter(Q(end__isnull=True) | Q(end__gt=now))
        .values("host")
        .annotate(cpu=Sum("vcpus"), mem=Sum("memory_mib"), dsk=Sum("disk_gib"))
    )
    return {row["host"]: row for row in rows}


def _instances_on(hosts):
    names = defaultdict(list)
    for vm in VM.objects.filter(host__in=hosts).exclude(state__in=(VM.State.DESTROYED, VM.State.FAILED)):
        names[vm.host_id].append(instance_name(vm))
    return names


def node_rows(hosts):
    hosts = list(hosts)
    used, placed = _used_now(hosts), _instances_on(hosts)
    return [_node(host, used.get(host.pk, {}), sorted(placed.get(host.pk, []))) for host in hosts]


def _node(host, used, instances):
    exclusive = bool(host.group and host.group.exclusive_storage)
    mfree = max(0, int(host.usable_memory_mib - (used.get("mem") or 0)))
    dfree = max(0, int((host.usable_disk_gib - (used.get("dsk") or 0)) * 1024))
    role = ROLES[host.state]
    return {
        "name": host.name,
        "offline": host.state == Hypervisor.State.OFFLINE,
        "master_candidate": False,
        "drained": host.state == Hypervisor.State.DRAINED,
        "dtotal": host.disk_gib * 1024,
        "dfree": dfree,
        "sptotal": host.spindles,
        "spfree": host.spindles,
        "mtotal": host.memory_mib,
        "mnode": host.reserved_memory_mib,
        "mfree": mfree,
        "pinst_cnt": len(instances),
        "sinst_cnt": 0,
        "ctotal": host.cpus,
        "cnos": host.reserved_cpus,
        "cnodes": 1,
        "csockets": 1,
        "pip": host.address,
        "sip": host.address,
        "role": role,
        "pinst_list": instances,
        "sinst_list": [],
        "master_capable": False,
        "vm_capable": True,
        "ndparams": {"exclusive_storage": exclusive, "spindle_count": host.spindles, "oob_program": None},
        "group.uuid": _group_uuid(host.group),
        "ctime": _epoch(host.created),
        "mtime": _epoch(host.updated),
        "uuid": _uuid("node", host.pk),
        "serial_no": 1,
        "tags": sorted(tag.name for tag in host.tags.all()),
    }


def nodes_queryset():
    return Hypervisor.objects.select_related("group").prefetch_related("tags").order_by("name")


# --- groups ---------------------------------------------------------------------------


def _group_uuid(group):
    return _uuid("group", group.pk if group else DEFAULT_GROUP)


def _ipolicy(ratio):
    tiny = ganeti_types.ISpec(1, 1, 1, 1, 1, 1)
    huge = ganeti_types.ISpec(1 << 31, 1 << 16, 1 << 40, 16, 8, 12)
    policy = ganeti_types.IPolicy(((tiny, huge),), ganeti_types.DEFAULT_STD, ganeti_types.DISK_TEMPLATES, ratio, 32.0)
    return policy.to_json()


def group_rows():
    """Every node group, and ``default`` for the hosts in none (when there are such hosts)."""
    members = defaultdict(list)
    ratios = defaultdict(lambda: 1.0)
    for group_id, name, ratio in Hypervisor.objects.order_by("name").values_list("group", "name", "cpu_ratio"):
        members[group_id].append(name)
        ratios[group_id] = max(ratios[group_id], ratio)
    groups = [(group, group.pk) for group in NodeGroup.objects.order_by("name")]
    if members.get(None):
        groups.append((None, None))
    return [_group(group, members.get(key, []), ratios[key]) for group, key in groups]


def _group(group, nodes, ratio):
    exclusive = bool(group and group.exclusive_storage)
    return {
        "alloc_policy": group.alloc_policy if group else NodeGroup.AllocPolicy.PREFERRED.value,
        "name": group.name if group else DEFAULT_GROUP,
        "node_cnt": len(nodes),
        "node_list": nodes,
        "ipolicy": _ipolicy(ratio),
        "custom_ipolicy": {},
        "diskparams": {},
        "custom_diskparams": {},
        "ndparams": {"exclusive_storage": exclusive, "spindle_count": 1, "oob_program": None},
        "custom_ndparams": {},
        "ctime": _epoch(group.created) if group else None,
        "mtime": _epoch(group.updated) if group else None,
        "uuid": _group_uuid(group),
        "serial_no": 1,
        "tags": [],
    }


# --- instances ------------------------------------------------------------------------

S = VM.State
_BUILDING = (S.REQUESTED, S.STAGING, S.DEFINING, S.STARTING)


def _status(vm):
    """(admin_state, status, oper_state) in Ganeti's words."""
    if vm.state == S.FAILED:
        return "offline", "ADMIN_offline", False
    if vm.host and vm.host.state == Hypervisor.State.OFFLINE and vm.state not in _BUILDING:
        return "up", "ERROR_nodeoffline", False
    if vm.state in (S.RUNNING, S.MIGRATING):
        return "up", "running", True
    if vm.state in (S.STOPPED, S.SUSPENDED):
        return "down", "ADMIN_down", False
    if vm.state == S.ERROR:
        return "down", "ERROR_down", False
    return "up", "ERROR_up", False  # being built: wanted up, not running yet


def instance_rows(vms):
    return [_instance(vm) for vm in vms]


def instances_queryset(user):
    return live_vms(user).select_related("host", "image").prefetch_related("tags").order_by("id")


def _instance(vm):
    admin_state, status, oper_state = _status(vm)
    disk_mib = vm.disk_gib * 1024
    beparams = {
        "maxmem": vm.memory_mib,
        "minmem": vm.memory_mib,
        "memory": vm.memory_mib,
        "vcpus": vm.vcpus,
        "auto_balance": True,
        "always_failover": False,
        "spindle_use": 1,
    }
    return {
        "name": instance_name(vm),
        "admin_state": admin_state,
        "admin_state_source": "admin",
        "os": vm.image.name,
        "pnode": vm.host.name if vm.host else None,
        "snodes": [],
        "disk_template": "plain",
        "nic.ips": [vm.address],
        "nic.macs": [None],
        "nic.modes": ["bridged"],
        "nic.uuids": [_uuid("nic", vm.pk)],
        "nic.names": [None],
        "nic.links": [None],
        "nic.networks": [None],
        "nic.networks.names": [None],
        "nic.bridges": [None],
        "network_port": vm.port,
        "disk.sizes": [disk_mib],
        "disk.spindles": [None],
        "disk_usage": disk_mib,
        "disk.uuids": [_uuid("disk", vm.pk)],
        "disk.names": [None],
        "beparams": beparams,
        "hvparams": {},
        "oper_state": oper_state,
        "oper_ram": vm.memory_mib if oper_state else None,
        "oper_vcpus": vm.vcpus if oper_state else None,
        "status": status,
        "custom_hvparams": {},
        "custom_beparams": {},
        "custom_nicparams": [{}],
        "custom_osparams": {},
        "ctime": _epoch(vm.created),
        "mtime": _epoch(vm.updated),
        "uuid": _uuid("instance", vm.pk),
        "serial_no": 1,
        "tags": sorted(tag.name for tag in vm.tags.all()),
    }


# --- job filter rules -----------------------------------------------------------------


def filter_row(rule):
    return {
        "uuid": str(rule.uuid),
        "priority": rule.priority,
        "predicates": rule.predicates,
        "action": rule.action,
        "reason_trail": rule.reason_trail,
        "watermark": rule.watermark,
    }


# --- jobs -----------------------------------------------------------------------------


def op_id(opcode):
    return OP_IDS.get(opcode, "OP_" + opcode.upper().replace(".", "_"))


def job_status(job):
    if job.status == Job.Status.RUNNING and job.cancel_requested:
        return "canceling"
    return job.status


def _subject(job, names):
    """What the job is about, for its summary (Ganeti: ``INSTANCE_CREATE(web1)``)."""
    params = job.params or {}
    if "vm" in params:
        return names["vm"].get(params["vm"], f"vcl-{params['vm']}")
    if "hypervisor" in params:
        return names["host"].get(params["hypervisor"], str(params["hypervisor"]))
    return None


def _names_for(jobs, viewer):
    """Names of the VMs and hosts the jobs' params refer to, as far as ``viewer`` may see them: a
    user's job may name any VM id (refused when it runs), which must not reveal its name."""
    vm_ids = {j.params.get("vm") for j in jobs if isinstance(j.params, dict) and "vm" in j.params}
    host_ids = {j.params.get("hypervisor") for j in jobs if isinstance(j.params, dict) and "hypervisor" in j.params}
    vms = VM.objects.filter(pk__in=vm_ids).only("id", "name")
    vms = {vm.pk: instance_name(vm) for vm in (vms if access.can(viewer, "see_all") else vms.filter(owner=viewer))}
    seen_hosts = host_ids if access.can(viewer, "see_cluster") else ()
    hosts = dict(Hypervisor.objects.filter(pk__in=seen_hosts).values_list("pk", "name"))
    return {"vm": vms, "host": hosts}


def _opresult(job, names):
    """The opcode's result as Ganeti gives it for the same opcode; an error as
    ``[error class, [message, error code]]``."""
    if job.status == Job.Status.ERROR:
        prereq = job.error_kind in ("invalid", "dependency") or not job.started
        return ["OpPrereqError" if prereq else "OpExecError", [job.error_message, "wrong_state" if prereq else ""]]
    if job.status != Job.Status.SUCCESS:
        return None
    result = job.result
    if isinstance(result, dict) and set(result) == {"result", "children"}:  # a parent: its own result
        result = result["result"]
    if job.opcode == "vm.create" and isinstance(result, dict):
        host = Hypervisor.objects.filter(pk=result.get("host")).values_list("name", flat=True).first()
        return [host] if host else []
    if job.opcode == "node.evacuate":  # Ganeti's JobIdListOnly: the jobs it submitted
        # An evacuation runs as a plan whose vm.migrate jobs the result lists (not child jobs).
        submitted = [j for j in result.get("jobs", []) if j] if isinstance(result, dict) else []
        submitted += job.children.order_by("id").values_list("id", flat=True)
        return {"jobs": [[True, jid] for jid in sorted(set(submitted))]}
    if job.opcode in ("node.set_role", "vm.resize") and isinstance(result, dict):
        return result.get("changes", [])
    if job.opcode in ("vm.destroy", "vm.migrate", "tags.set", "tags.delete", "group.assign_nodes"):
        return None
    return result


def _op(job):
    op = {"OP_ID": op_id(job.opcode), **(job.params if isinstance(job.params, dict) else {})}
    op["priority"] = job.priority
    op["reason"] = [list(entry) for entry in job.reason]
    op["vclmgr_opcode"] = job.opcode
    return op


def _oplog(entries):
    return [[entry.pk, _ts(entry.time), "message", entry.message] for entry in entries]


def job_rows(jobs, *, viewer, full, log_for=None):
    """Ganeti's job fields (``J_FIELDS``; ``J_FIELDS_BULK`` without ``full``)."""
    jobs = list(jobs)
    names = _names_for(jobs, viewer)
    rows = []
    for job in jobs:
        subject = _subject(job, names)
        short = op_id(job.opcode).removeprefix("OP_")
        row = {
            "id": job.pk,
            "ops": [_op(job)],
            "status": job_status(job),
            "summary": [f"{short}({subject})" if subject is not None else short],
            "opstatus": [job_status(job)],
            "received_ts": _ts(job.received),
            "start_ts": _ts(job.started),
            "end_ts": _ts(job.ended),
        }
        if full:
            row["oplog"] = [_oplog(log_for(job))]
            row["opresult"] = [_opresult(job, names)]
        rows.append(row)
    return rows


JOB_FIELDS = ("id", "ops", "status", "summary", "opstatus", "received_ts", "start_ts", "end_ts", "oplog", "opresult")
