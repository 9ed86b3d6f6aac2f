"""A node group's writes, ``/2/groups/NAME/modify`` and ``/assign-nodes``, each one job.

A group's allocation policy is what vclmgr's groups share with Ganeti's; its other parameters
(ndparams, ipolicy, disk parameters, states) are refused by name. The implicit ``default``
group (the hosts in no group) cannot be modified, but hosts can be assigned to it.
"""

from inventory.models import NodeGroup
from rapi import resources as R
from rapi import services
from rapi.protocol import RapiError, bad_request
from rapi.views import _check, _fields, _job_answer, _no_dry_run, _staff

MODIFY_FIELDS = ("alloc_policy", "ndparams", "diskparams", "hv_state", "disk_state", "ipolicy", "custom_ndparams")


def _group(name):
    """The group a Ganeti name means: a node group, or None for the implicit ``default``."""
    group = NodeGroup.objects.filter(name=name).first()
    if group is None and name != R.DEFAULT_GROUP:
        raise RapiError(404, f"Group '{name}' not known")
    return group


def modify(request, name):
    _staff(request)
    group = _group(name)
    body = _fields(request.body, MODIFY_FIELDS)
    refused = sorted(key for key in body if key != "alloc_policy" and body[key] not in (None, {}))
    if refused:
        raise bad_request(f"Parameter(s) {', '.join(map(repr, refused))} are not supported: vclmgr's groups have an "
                          "allocation policy (and a placement policy, set in vclmgr)")  # fmt: skip
    if "alloc_policy" not in body:
        raise bad_request("No changes submitted")
    policy = _check(body["alloc_policy"], str, "'alloc_policy' parameter")
    if policy not in NodeGroup.AllocPolicy.values:
        raise bad_request(f"Invalid alloc_policy {policy!r}: one of {', '.join(NodeGroup.AllocPolicy.values)}")
    if group is None:
        raise bad_request("The implicit default group (hosts in no group) has no policy of its own; create a group")
    _no_dry_run(request)
    params = {"group": group.pk, "alloc_policy": policy}
    reason = request.reason or f"modify group {name} through the RAPI"
    return _job_answer(services.submit("group.modify", params, actor=request.user, reason=reason))


def assign_nodes(request, name):
    _staff(request)
    group = _group(name)
    body = _fields(_check(request.body, dict, "Body contents"), ("nodes",))
    nodes = _check(body.get("nodes"), list, "'nodes' parameter")
    if not nodes:
        raise bad_request("'nodes' parameter: at least one node")
    hosts = [R.find_node(_check(node, str, "'nodes' item")).pk for node in nodes]
    _no_dry_run(request)
    params = {"group": group.pk if group else None, "hypervisors": sorted(set(hosts))}
    reason = request.reason or f"assign nodes to group {name} through the RAPI"
    return _job_answer(services.submit("group.assign_nodes", params, actor=request.user, reason=reason))
