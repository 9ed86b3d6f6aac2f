"""The ``/2/`` resources, one handler per method, as ``lib/rapi/rlib2.py`` lays them out.

Reads follow the REST API's rules: nodes, groups and the job queue of others are staff's;
users see their own instances and jobs. Writes (staff, ``protocol``) submit a job and answer
its id. Bodies are checked as Ganeti's opcodes check them: an unknown field or a wrong type
is 400 and nothing is submitted; a field vclmgr cannot honour is refused by name, never ignored.
"""

import math
import time

from accounts import access
from core.errors import Conflict
from inventory.models import Hypervisor
from jobs import services as jobs
from provisioning.models import Image
from rapi import query, services
from rapi import resources as R
from rapi.models import ClusterTag
from rapi.protocol import RapiError, bad_request, resource

RAPI_VERSION = 2
FEATURES = ["instance-create-reqv1", "instance-reinstall-reqv1", "node-evac-res1"]
WAIT_SECONDS = 10  # rlib2's _WFJC_TIMEOUT
WAIT_POLL = 0.2
MAX_NAME = 100
#: Ganeti's names for vclmgr's hypervisor kinds (the simulator is Ganeti's ``fake``).
GANETI_HYPERVISORS = {"sim": "fake", "libvirt": "kvm", "vmware": "vmware"}


def _staff(request):
    if not access.can(request.user, "see_cluster"):
        raise RapiError(403, "Only operators and auditors may see the nodes and groups")


def _no_dry_run(request):
    if request.flag("dry-run"):
        raise bad_request("dry-run is not supported by vclmgr: nothing was submitted")


def _check(value, kind, what):
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise bad_request(f"{what}: Type is '{type(value).__name__}', but '{kind.__name__}' is expected")
    return value


def _fields(body, allowed, what="Body contents"):
    """The body as a dict with only ``allowed`` keys (unknown ones are refused by name)."""
    if body is None:
        return {}
    _check(body, dict, what)
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise bad_request(f"Invalid body parameters: unknown field(s) {', '.join(map(repr, unknown))}")
    return body


def _job_answer(job):
    return job.pk


# --- cluster --------------------------------------------------------------------------


def root(request):
    return None


def version(request):
    return RAPI_VERSION


def features(request):
    return FEATURES


def info(request):
    hv_types = sorted({GANETI_HYPERVISORS.get(hv, hv) for hv in Hypervisor.objects.values_list("driver", flat=True)})
    return {
        "name": R.master_name(),
        "master": R.master_name(),
        "software_version": "vclmgr",
        "protocol_version": 2,
        "config_version": 2,
        "os_api_version": 20,
        "export_version": 0,
        "architecture": ["64bit", "x86_64"],
        "default_hypervisor": hv_types[0] if hv_types else "fake",
        "enabled_hypervisors": hv_types,
        "hvparams": {kind: {} for kind in hv_types},
        "beparams": {
            "default": {
                "vcpus": 1,
                "maxmem": 1024,
                "minmem": 1024,
                "memory": 1024,
                "auto_balance": True,
                "always_failover": False,
                "spindle_use": 1,
            }
        },
        "ndparams": {"exclusive_storage": False, "spindle_count": 1, "oob_program": None},
        "ipolicy": R._ipolicy(1.0),
        "candidate_pool_size": 0,
        "tags": cluster_tag_names(),
        "uuid": R._uuid("cluster", 1),
        "ctime": None,
        "mtime": None,
    }


def cluster_tag_names():
    return list(ClusterTag.objects.order_by("name").values_list("name", flat=True))


# --- nodes ----------------------------------------------------------------------------


def nodes(request):
    _staff(request)
    if request.flag("bulk"):
        return R.node_rows(R.nodes_queryset())
    names = Hypervisor.objects.order_by("name").values_list("name", flat=True)
    return [{"id": name, "uri": f"/2/nodes/{name}"} for name in names]


def node(request, name):
    _staff(request)
    host = R.find_node(name)
    return R.node_rows(R.nodes_queryset().filter(pk=host.pk))[0]


def node_role(request, name):
    _staff(request)
    return R.ROLE_NAMES[R.ROLES[R.find_node(name).state]]


def set_node_role(request, name):
    host = R.find_node(name)
    role = _check(request.body, str, "Body contents")
    if role not in ("regular", "drained", "offline"):
        raise bad_request(f"Can't set '{role}' role")
    _no_dry_run(request)
    reason = request.reason or f"{role} through the RAPI"
    job = services.submit(
        "node.set_role",
        {"hypervisor": host.pk, "role": role, "reason": reason[:500]},
        actor=request.user,
        reason=reason,
    )
    return _job_answer(job)


EVACUATE_FIELDS = ("mode", "iallocator", "remote_node", "early_release", "ignore_soft_errors", "depends")


def evacuate_node(request, name):
    host = R.find_node(name)
    body = _fields(request.body, EVACUATE_FIELDS)
    mode = _check(body.get("mode", "all"), str, "'mode' parameter")
    if mode not in ("all", "primary-only", "secondary-only"):
        raise bad_request(f"Invalid body parameters: mode must be all, primary-only or secondary-only, not {mode!r}")
    if mode == "secondary-only":
        raise bad_request("vclmgr instances have no secondary nodes: nothing to evacuate in secondary-only mode")
    for flag in ("early_release", "ignore_soft_errors"):
        if flag in body:
            _check(body[flag], bool, f"'{flag}' parameter")
    if body.get("remote_node") is not None:
        raise bad_request("remote_node is not supported: vclmgr's allocator chooses each instance's new node")
    if body.get("iallocator") is not None:
        _check(body["iallocator"], str, "'iallocator' parameter")
    if body.get("depends"):
        raise bad_request("depends is not supported on this resource")
    _no_dry_run(request)
    job = services.submit(
        "node.evacuate",
        {"hypervisor": host.pk},
        actor=request.user,
        reason=request.reason or f"evacuate {host.name} through the RAPI",
    )
    return _job_answer(job)


# --- groups ---------------------------------------------------------------------------


def groups(request):
    _staff(request)
    rows = R.group_rows()
    if request.flag("bulk"):
        return rows
    return [{"name": row["name"], "uri": f"/2/groups/{row['name']}"} for row in rows]


def group(request, name):
    _staff(request)
    for row in R.group_rows():
        if row["name"] == name:
            return row
    raise RapiError(404, f"Group '{name}' not known")


# --- instances ------------------------------------------------------------------------


def instances(request):
    if request.flag("bulk"):
        return R.instance_rows(R.instances_queryset(request.user))
    names = sorted(R.instance_name(vm) for vm in R.live_vms(request.user).only("id", "name"))
    return [{"id": name, "uri": f"/2/instances/{name}"} for name in names]


def instance(request, name):
    vm = R.find_instance(request.user, name)
    return R.instance_rows(R.instances_queryset(request.user).filter(pk=vm.pk))[0]


#: OP_INSTANCE_CREATE's fields that vclmgr takes; the rest of Ganeti's are refused by name.
CREATE_FIELDS = {
    "__version__", "mode", "instance_name", "name", "os_type", "os", "disk_template", "disks", "nics",
    "beparams", "pnode", "iallocator", "start", "ip_check", "name_check", "wait_for_sync", "conflicts_check",
    "hypervisor", "tags", "osparams", "no_install",
}  # fmt: skip
BEPARAMS = {"memory": int, "maxmem": int, "minmem": int, "vcpus": int, "auto_balance": bool,
            "always_failover": bool, "spindle_use": int}  # fmt: skip
DISK_FIELDS = {"size": int, "mode": str, "name": str, "spindles": int, "vg": str}
NIC_FIELDS = {"mode", "link", "ip", "mac", "network", "name", "vlan"}
TEMPLATES = {"diskless", "file", "sharedfile", "plain", "blockdev", "rbd", "ext", "gluster"}


def _renamed(body, old, new):
    """A required parameter that Ganeti renamed (both names accepted, as rlib2's ``POST_RENAME``)."""
    if old in body and new in body:
        raise bad_request(f"Parameter '{old}' was renamed to '{new}', but both are specified")
    if old not in body and new not in body:
        raise bad_request(f"Required parameter '{new}' is missing")
    return body.get(new, body.get(old))


def _create_args(request):
    body = _check(request.body, dict, "Body contents")
    version = body.get("__version__", 0)
    if isinstance(version, bool) or version == 0:
        raise bad_request("Instance creation request version 0 is no longer supported")
    if version != 1:
        raise bad_request(f"Unsupported request data version {version}")
    return create_args(body)


def create_args(body):
    """``(name, os, sizes, pnode name)`` of one instance's creation (OP_INSTANCE_CREATE's fields)."""
    _fields(body, CREATE_FIELDS)
    if _check(body.get("mode", "create"), str, "'mode' parameter") != "create":
        raise bad_request("Only mode 'create' is supported (vclmgr builds instances from its images)")
    name = _check(_renamed(body, "name", "instance_name"), str, "'instance_name' parameter")
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise bad_request(f"'instance_name' parameter: a printable name of 1 to {MAX_NAME} characters")
    os_name = _check(_renamed(body, "os", "os_type"), str, "'os_type' parameter")
    template = _check(body.get("disk_template", "plain"), str, "'disk_template' parameter")
    if template not in TEMPLATES:
        raise bad_request(f"Disk template '{template}' is not supported (vclmgr instances have no secondary node)")
    for flag in ("start", "ip_check", "name_check", "wait_for_sync", "conflicts_check", "no_install"):
        if flag in body:
            _check(body[flag], bool, f"'{flag}' parameter")
    if body.get("start") is False or body.get("no_install") is True:
        raise bad_request("vclmgr builds and starts every instance: start=false and no_install=true are not supported")
    for field in ("osparams",):
        if body.get(field):
            raise bad_request(f"'{field}' is not supported: the image defines the instance")
    if body.get("tags"):
        raise bad_request("'tags' at creation is not supported: add them with PUT /2/instances/NAME/tags")
    for field in ("hypervisor", "iallocator"):
        if body.get(field) is not None:
            _check(body[field], str, f"'{field}' parameter")
    return name, os_name, _sizes(body), body.get("pnode")


def _sizes(body):
    beparams = _check(body.get("beparams", {}), dict, "'beparams' parameter")
    for key, value in beparams.items():
        if key not in BEPARAMS:
            raise bad_request(f"Invalid body parameters: unknown beparams field '{key}'")
        _check(value, BEPARAMS[key], f"'beparams.{key}' parameter")
    disks = _check(body.get("disks", []), list, "'disks' parameter")
    if len(disks) > 1:
        raise bad_request("vclmgr instances have one disk; give at most one")
    disk_gib = None
    for disk in disks:
        _check(disk, dict, "'disks' item")
        for key, value in disk.items():
            if key not in DISK_FIELDS:
                raise bad_request(f"Invalid body parameters: unknown disk field '{key}'")
            if value is not None or key == "size":
                _check(value, DISK_FIELDS[key], f"'disks.{key}' parameter")
        if "size" not in disk or disk["size"] < 1:
            raise bad_request("'disks' item: 'size' (MiB, at least 1) is required")
        disk_gib = math.ceil(disk["size"] / 1024)
    for nic in _check(body.get("nics", []), list, "'nics' parameter"):
        _check(nic, dict, "'nics' item")
        unknown = sorted(set(nic) - NIC_FIELDS)
        if unknown:
            raise bad_request(f"Invalid body parameters: unknown nic field(s) {', '.join(unknown)}")
    memory = beparams.get("maxmem", beparams.get("memory"))
    return {"vcpus": beparams.get("vcpus"), "memory_mib": memory, "disk_gib": disk_gib}


def creation(args):
    """The keyword arguments of ``services.create_instance`` for ``create_args``' answer."""
    name, os_name, sizes, pnode_name = args
    image = Image.objects.filter(name=os_name).first()
    if image is None:
        raise bad_request(f"OS '{os_name}' not known (vclmgr's images are the operating systems)")
    pnode = R.find_node(_check(pnode_name, str, "'pnode' parameter")) if pnode_name is not None else None
    for key, value in sizes.items():
        if value is not None and value < (0 if key == "disk_gib" else 1):
            raise bad_request(f"{key} must be positive")
    return {"image": image, "name": name, "pnode": pnode, **sizes}


def create_instance(request):
    args = _create_args(request)
    _no_dry_run(request)
    job = services.create_instance(actor=request.user, reason=request.reason, **creation(args))
    return _job_answer(job)


def delete_instance(request, name):
    vm = R.find_instance(request.user, name)
    _fields(request.body, ("shutdown_timeout", "ignore_failures"))
    _no_dry_run(request)
    return _job_answer(services.submit_vm(vm, "destroy", actor=request.user, reason=request.reason))


MIGRATE_FIELDS = ("mode", "live", "cleanup", "target_node", "iallocator", "allow_failover",
                  "ignore_ipolicy", "ignore_hvversions", "allow_runtime_changes")  # fmt: skip


def migrate_instance(request, name):
    vm = R.find_instance(request.user, name)
    body = _fields(request.body, MIGRATE_FIELDS)
    if body.get("mode") is not None and _check(body["mode"], str, "'mode' parameter") not in ("live", "non-live"):
        raise bad_request(f"Invalid body parameters: mode must be live or non-live, not {body['mode']!r}")
    for flag in ("live", "cleanup", "allow_failover", "ignore_ipolicy", "ignore_hvversions", "allow_runtime_changes"):
        if flag in body and body[flag] is not None:
            _check(body[flag], bool, f"'{flag}' parameter")
    if body.get("cleanup"):
        raise bad_request("cleanup is not supported: a failed vclmgr migration cleans up after itself")
    target = None
    if body.get("target_node") is not None:
        target = R.find_node(_check(body["target_node"], str, "'target_node' parameter")).pk
    _no_dry_run(request)
    return _job_answer(services.submit_vm(vm, "migrate", actor=request.user, reason=request.reason, target=target))


# --- tags -----------------------------------------------------------------------------


def _tag_list(request):
    tags = request.query.getlist("tag")
    if not tags:
        raise bad_request("Give the tags as ?tag=NAME (repeat for several)")
    for tag in tags:
        if not tag or len(tag) > 100 or "," in tag or not tag.isprintable():
            raise bad_request(f"Invalid tag {tag[:30]!r}: at most 100 printable characters, no comma")
    return sorted(set(tags))


def _change_tags(request, kind, target, add):
    tags = _tag_list(request)
    _no_dry_run(request)
    verb = "tags.set" if add else "tags.delete"
    params = {"kind": kind, "target": target, "tags": tags}
    return _job_answer(services.submit(verb, params, actor=request.user, reason=request.reason or f"{verb} {kind}"))


def cluster_tags(request):
    return cluster_tag_names()


def node_tags(request, name):
    _staff(request)
    return sorted(R.find_node(name).tags.names())


def instance_tags(request, name):
    return sorted(R.find_instance(request.user, name).tags.names())


def tag_writer(kind, add):
    def write(request, name=None):
        if kind == "cluster":
            target = None
        elif kind == "node":
            target = R.find_node(name).pk
        else:
            target = R.find_instance(request.user, name).pk
        return _change_tags(request, kind, target, add)

    return write


# --- jobs -----------------------------------------------------------------------------


def _visible_jobs(request):
    return jobs.visible_to(request.user).filter(archived=False).order_by("id")


def job_list(request):
    visible = _visible_jobs(request)
    if request.flag("bulk"):
        return R.job_rows(visible, viewer=request.user, full=False)
    return [{"id": pk, "uri": f"/2/jobs/{pk}"} for pk in visible.values_list("id", flat=True)]


def _job(request, job_id):
    job = jobs.visible_to(request.user).filter(pk=job_id).first()
    if job is None:
        raise RapiError(404, f"Job {job_id} not known")
    return job


def _log_for(request):
    return lambda job: jobs.log_visible_to(request.user, job)


def job(request, job_id):
    return R.job_rows([_job(request, job_id)], viewer=request.user, full=True, log_for=_log_for(request))[0]


def cancel_job(request, job_id):
    found = _job(request, job_id)
    try:
        jobs.cancel(found, actor=request.user, reason=request.reason)
    except Conflict as exc:  # Ganeti answers a refused cancel as (False, message), with 200
        return [False, str(exc)]
    return [True, f"Job {found.pk} will be canceled"]


def _job_state(request, job_id, fields, prev_serial):
    found = _job(request, job_id)
    row = R.job_rows([found], viewer=request.user, full=True, log_for=_log_for(request))[0]
    unknown = [name for name in fields if name not in R.JOB_FIELDS]
    if unknown:
        raise bad_request(f"Unknown job field(s): {', '.join(map(str, unknown))}")
    logs = [entry for entry in row["oplog"][0] if prev_serial is None or entry[0] > prev_serial]
    return found, [row[name] for name in fields], logs


def wait_job(request, job_id):
    """Ganeti's WaitForJobChange: answer as soon as the fields or the log differ from what the
    client has, at once for a finished job, and ``None`` after 10 s without a change."""
    body = _check(request.body, dict, "Body contents") if request.body is not None else {}
    if "fields" not in body:
        raise bad_request("Required parameter 'fields' is missing")
    fields, previous = body["fields"], body.get("previous_job_info")
    prev_serial = body.get("previous_log_serial")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise bad_request("The 'fields' parameter should be a list")
    if not (previous is None or isinstance(previous, list)):
        raise bad_request("The 'previous_job_info' parameter should be a list")
    if not (prev_serial is None or (isinstance(prev_serial, int) and not isinstance(prev_serial, bool))):
        raise bad_request("The 'previous_log_serial' parameter should be a number")
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        found, info, logs = _job_state(request, job_id, fields, prev_serial)
        if found.is_final or info != previous or logs:
            return {"job_info": info, "log_entries": logs}
        if time.monotonic() >= deadline:
            return None
        time.sleep(WAIT_POLL)


# --- the routes' method tables ----------------------------------------------------------

ROOT = resource(GET=root)
VERSION = resource(GET=version)
FEATURES_RESOURCE = resource(GET=features)
INFO = resource(GET=info)
TAGS = resource(GET=cluster_tags, PUT=tag_writer("cluster", True), DELETE=tag_writer("cluster", False))
NODES = resource(GET=nodes)
NODE = resource(GET=node)
NODE_ROLE = resource(GET=node_role, PUT=set_node_role)
NODE_EVACUATE = resource(POST=evacuate_node)
NODE_TAGS = resource(GET=node_tags, PUT=tag_writer("node", True), DELETE=tag_writer("node", False))
GROUPS = resource(GET=groups)
GROUP = resource(GET=group)
INSTANCES = resource(GET=instances, POST=create_instance)
INSTANCE = resource(GET=instance, DELETE=delete_instance)
INSTANCE_MIGRATE = resource(PUT=migrate_instance)
INSTANCE_TAGS = resource(GET=instance_tags, PUT=tag_writer("instance", True), DELETE=tag_writer("instance", False))
QUERY = resource(GET=query.query_get, PUT=query.query_put, reads=("PUT",))
QUERY_FIELDS = resource(GET=query.query_fields)
JOBS = resource(GET=job_list)
JOB = resource(GET=job, DELETE=cancel_job)
JOB_WAIT = resource(GET=wait_job)
