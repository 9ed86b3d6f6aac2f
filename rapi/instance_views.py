"""An instance's actions under ``/2/instances/NAME/…``, as ``rlib2.py`` lays them out.

Each write maps onto vclmgr's VM actions through ``services`` and answers one job id: startup
and shutdown are ``vm.start``/``vm.stop``, a reboot is a stop then a start that waits for it,
a failover is ``vm.migrate``, a reinstall reverts to the image's clean snapshot, a rename is
``instance.rename``, a modify of the backend parameters (vCPUs, memory) is ``vm.resize``.
Ganeti's parameters vclmgr cannot honour are refused by name (400), with nothing submitted.
"""

from console import services as console
from drivers.base import DriverError
from rapi import resources as R
from rapi import services
from rapi.protocol import RapiError, bad_request
from rapi.views import BEPARAMS, MAX_NAME, _check, _fields, _job_answer, _no_dry_run, create_args, creation

REBOOT_TYPES = ("soft", "hard", "full")
MAX_MULTI_ALLOC = 100
VNC_BASE_PORT = 5900


def _no_remember(request):
    if request.flag("no_remember"):
        raise bad_request("no_remember is not supported: vclmgr always records an instance's wanted state")


def startup(request, name):
    vm = R.find_instance(request.user, name)
    _no_remember(request)
    _fields(request.body, ())
    _no_dry_run(request)
    return _job_answer(services.submit_vm(vm, "start", actor=request.user, reason=request.reason))


def shutdown(request, name):
    vm = R.find_instance(request.user, name)
    _no_remember(request)
    body = _fields(request.body, ("timeout",))
    force = False
    if "timeout" in body:
        # Ganeti waits ``timeout`` seconds before it forces; vclmgr's drivers keep their own grace.
        if _check(body["timeout"], int, "'timeout' parameter") != 0:
            raise bad_request("timeout: only 0 (stop at once) is supported; without it the guest shuts down")
        force = True
    _no_dry_run(request)
    return _job_answer(services.submit_vm(vm, "stop", actor=request.user, reason=request.reason, force=force))


def reboot(request, name):
    vm = R.find_instance(request.user, name)
    kind = request.text("type") or "hard"
    if kind not in REBOOT_TYPES:
        raise bad_request(f"Invalid reboot type {kind!r}: one of {', '.join(REBOOT_TYPES)}")
    _fields(request.body, ())  # shutdown_timeout too: vclmgr's drivers keep their own grace period
    _no_dry_run(request)
    return _job_answer(services.reboot(vm, actor=request.user, reason=request.reason))


FAILOVER_FIELDS = ("iallocator", "ignore_consistency", "target_node", "shutdown_timeout", "ignore_ipolicy", "cleanup")


def failover(request, name):
    """A failover moves the instance to another node: vclmgr's migration (its disk goes along)."""
    vm = R.find_instance(request.user, name)
    body = _fields(request.body, FAILOVER_FIELDS)
    for flag in ("ignore_consistency", "ignore_ipolicy", "cleanup"):
        if flag in body:
            _check(body[flag], bool, f"'{flag}' parameter")
    if body.get("cleanup"):
        raise bad_request("cleanup is not supported: a failed vclmgr migration cleans up after itself")
    if body.get("iallocator") is not None:
        _check(body["iallocator"], str, "'iallocator' parameter")
    target = None
    if body.get("target_node") is not None:
        target = R.find_node(_check(body["target_node"], str, "'target_node' parameter")).pk
    _no_dry_run(request)
    return _job_answer(services.submit_vm(vm, "migrate", actor=request.user, reason=request.reason, target=target))


def rename(request, name):
    vm = R.find_instance(request.user, name)
    body = _fields(_check(request.body, dict, "Body contents"), ("new_name", "ip_check", "name_check"))
    if "new_name" not in body:
        raise bad_request("Required parameter 'new_name' is missing")
    new_name = _check(body["new_name"], str, "'new_name' parameter")
    if not new_name or len(new_name) > MAX_NAME or not new_name.isprintable():
        raise bad_request(f"'new_name' parameter: a printable name of 1 to {MAX_NAME} characters")
    for flag in ("ip_check", "name_check"):
        if _check(body.get(flag, False), bool, f"'{flag}' parameter"):
            raise bad_request(f"{flag} is not supported: vclmgr's names are labels, not DNS names")
    _no_dry_run(request)
    params = {"vm": vm.pk, "name": new_name}
    reason = request.reason or f"rename {vm.key} to {new_name} through the RAPI"
    return _job_answer(services.submit("instance.rename", params, actor=request.user, reason=reason))


def reinstall(request, name):
    """Both of Ganeti's request forms: a body (``instance-reinstall-reqv1``) or query arguments."""
    vm = R.find_instance(request.user, name)
    if request.body is not None:
        body = _fields(request.body, ("start", "os", "osparams"))
        start = _check(body.get("start", True), bool, "'start' parameter")
        os_name = body.get("os")
        if body.get("osparams"):
            raise bad_request("'osparams' is not supported: the image defines the instance")
    else:
        start, os_name = not request.flag("nostartup"), request.text("os")
    if os_name is not None and _check(os_name, str, "'os' parameter") != vm.image.name:
        raise bad_request(f"vclmgr reinstalls an instance from its own image ({vm.image.name}), not {os_name!r}")
    _no_dry_run(request)
    return _job_answer(services.reinstall(vm, actor=request.user, reason=request.reason, start=start))


#: OP_INSTANCE_SET_PARAMS's fields vclmgr cannot change, and why (refused by name when they ask for anything).
NOT_MODIFIABLE = {
    "hvparams": "the hypervisor's parameters come from the image and the host",
    "nics": "an instance keeps the network it was built with",
    "disks": "an instance's disk keeps its size",
    "disk_template": "vclmgr instances have one disk template",
    "runtime_mem": "vclmgr does not balloon a running instance's memory",
    "os_name": "an instance keeps its image (reinstall it, or request a new one)",
    "osparams": "the image defines the instance",
    "osparams_private": "the image defines the instance",
    "clear_osparams": "the image defines the instance",
    "clear_osparams_private": "the image defines the instance",
    "remove_os_params": "the image defines the instance",
    "remove_os_params_private": "the image defines the instance",
    "pnode": "an instance moves to another node by a migration (PUT /2/instances/NAME/migrate)",
    "remote_node": "vclmgr instances have no secondary node",
    "iallocator": "vclmgr instances have no secondary node",
    "offline": "an instance is stopped or started, never marked offline",
    "ext_params": "vclmgr has no external storage parameters",
    "file_driver": "vclmgr has no file storage parameters",
    "file_storage_dir": "vclmgr has no file storage parameters",
    "instance_communication": "vclmgr has no instance communication channel",
    "hotplug": "a running instance gets its new size at its next boot",
}
MODIFY_FLAGS = ("force", "force_variant", "ignore_ipolicy", "wait_for_sync", "conflicts_check", "hotplug_if_possible")
#: backend parameters vclmgr keeps fixed at these values (what GET /2/instances/NAME shows)
FIXED_BEPARAMS = {"auto_balance": True, "always_failover": False, "spindle_use": 1}


def modify(request, name):
    """Ganeti's OP_INSTANCE_SET_PARAMS: its backend parameters (vcpus, maxmem, minmem or memory)
    are vclmgr's resize; anything else asked for is refused by name, with nothing submitted."""
    vm = R.find_instance(request.user, name)
    body = _fields(
        _check(request.body if request.body is not None else {}, dict, "Body contents"),
        ("beparams", *NOT_MODIFIABLE, *MODIFY_FLAGS),
    )
    for flag in MODIFY_FLAGS:
        if body.get(flag) is not None:
            _check(body[flag], bool, f"'{flag}' parameter")
    if body.get("force"):
        raise bad_request("force is not supported: vclmgr never gives an instance a size its node has no room for")
    for field, why in NOT_MODIFIABLE.items():
        if body.get(field) not in (None, [], {}, False):
            raise bad_request(f"Parameter '{field}' cannot be modified: {why}")
    size = _modified_size(vm, _check(body.get("beparams") or {}, dict, "'beparams' parameter"))
    if not size:
        raise bad_request("No changes submitted")
    _no_dry_run(request)
    return _job_answer(services.resize(vm, actor=request.user, reason=request.reason, **size))


def _modified_size(vm, beparams):
    """``{"vcpus", "memory_mib"}`` (those given) of Ganeti's backend parameters."""
    for key, value in beparams.items():
        if key not in BEPARAMS:
            raise bad_request(f"Invalid body parameters: unknown beparams field '{key}'")
        _check(value, BEPARAMS[key], f"'beparams.{key}' parameter")
        if key in FIXED_BEPARAMS and value != FIXED_BEPARAMS[key]:
            raise bad_request(
                f"Parameter 'beparams.{key}' cannot be modified: vclmgr keeps it at {FIXED_BEPARAMS[key]}"
            )
    if "memory" in beparams and "maxmem" in beparams and beparams["memory"] != beparams["maxmem"]:
        raise bad_request("'beparams.memory' is the old name of 'beparams.maxmem': give one, or both equal")
    memory = beparams.get("maxmem", beparams.get("memory"))
    if "minmem" in beparams and beparams["minmem"] != (memory if memory is not None else vm.memory_mib):
        raise bad_request(
            "Parameter 'beparams.minmem' cannot differ from maxmem: a vclmgr instance has one memory size "
            f"({memory if memory is not None else vm.memory_mib} MiB), no ballooning"
        )
    size = {}
    if beparams.get("vcpus") is not None:
        size["vcpus"] = beparams["vcpus"]
    if memory is not None:
        size["memory_mib"] = memory
    return size


def console_info(request, name):
    """Ganeti's console description: where the instance's VNC display listens on its node."""
    vm = R.find_instance(request.user, name)
    if not console.may_open(request.user, vm):
        raise RapiError(403, "Only the instance's owner and administrators may open its console")
    unavailable = console.unavailable_reason(vm)
    if unavailable:
        raise RapiError(503, f"Instance console unavailable: {unavailable}")
    try:
        host, port = console.vnc_address(vm)
    except DriverError as exc:
        raise RapiError(503, f"Instance console unavailable: {console.console_error(exc)}") from None
    return {
        "instance": R.instance_name(vm),
        "kind": "vnc",
        "host": host,
        "port": port,
        "display": port - VNC_BASE_PORT,
    }


def multi_alloc(request):
    """``POST /2/instances-multi-alloc``: every instance is checked before any is submitted."""
    body = _fields(_check(request.body, dict, "Body contents"), ("instances", "iallocator", "opportunistic_locking"))
    items = _check(body.get("instances"), list, "'instances' parameter")
    if not items or len(items) > MAX_MULTI_ALLOC:
        raise bad_request(f"'instances' parameter: 1 to {MAX_MULTI_ALLOC} instances")
    if body.get("iallocator") is not None:
        _check(body["iallocator"], str, "'iallocator' parameter")
    creations = []
    for index, item in enumerate(items):
        try:
            creations.append(creation(create_args(_check(item, dict, f"'instances' item {index}"))))
        except RapiError as exc:
            raise RapiError(exc.code, f"Instance {index}: {exc.message}") from None
    names = [c["name"] for c in creations]
    if len(set(names)) != len(names):
        raise bad_request("Each instance of a multi-allocation needs its own name")
    _no_dry_run(request)
    return _job_answer(services.multi_alloc(creations, actor=request.user, reason=request.reason))
