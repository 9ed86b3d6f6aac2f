"""The RAPI's own opcodes: Ganeti answers these writes with a job, vclmgr's services do them at once."""

from rest_framework import serializers

from inventory.models import Hypervisor, NodeGroup
from jobs.registry import StringListField, opcode
from provisioning import services as vms
from provisioning.models import VM
from rapi import services
from rapi.models import ClusterTag

ROLE_STATES = {"regular": Hypervisor.State.ONLINE, "drained": Hypervisor.State.DRAINED,
               "offline": Hypervisor.State.OFFLINE}  # fmt: skip


class RoleParams(serializers.Serializer):
    hypervisor = serializers.IntegerField(min_value=1)
    role = serializers.ChoiceField(choices=sorted(ROLE_STATES))
    reason = serializers.CharField(max_length=500)


class TagParams(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["cluster", "node", "instance"])
    target = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    tags = StringListField(min_length=1, max_length=20)

    def validate(self, data):
        if (data["kind"] == "cluster") != (data["target"] is None):
            raise serializers.ValidationError("a node or instance tag names its target; a cluster tag none")
        return data


class RenameParams(serializers.Serializer):
    vm = serializers.IntegerField(min_value=1)
    name = serializers.CharField(max_length=100)


def _target(params):
    if params["kind"] == "node":
        return Hypervisor.objects.get(pk=params["target"])
    if params["kind"] == "instance":
        return VM.objects.get(pk=params["target"])
    return ClusterTag


# No host lock: set_state locks the row, and a role change must not wait behind an image copy.
@opcode("node.set_role", params=RoleParams, staff_only=True)
def node_set_role(job):
    """Set a host's state from a Ganeti node role (regular = online, drained, offline)."""
    params = job.params

    def apply():
        host = Hypervisor.objects.get(pk=params["hypervisor"])
        changes = services.set_role(host, ROLE_STATES[params["role"]], params["reason"], actor=job.actor)
        return {"hypervisor": host.pk, "state": ROLE_STATES[params["role"]], "changes": changes}

    return job.step("set", apply)


def _tags_opcode(name, add):
    @opcode(name, params=TagParams, staff_only=True, description=f"{'Add' if add else 'Remove'} tags (Ganeti's).")
    def run(job):
        params = job.params
        job.step(
            "tags",
            lambda: services.change_tags(params["kind"], _target(params), params["tags"], add=add, actor=job.actor),
        )

    return run


tags_set = _tags_opcode("tags.set", add=True)
tags_delete = _tags_opcode("tags.delete", add=False)


@opcode("instance.rename", params=RenameParams, locks=lambda p: [f"vm:{p['vm']}"], staff_only=True)
def instance_rename(job):
    """Give an instance another name (Ganeti's OP_INSTANCE_RENAME; the VM's key stays)."""
    params = job.params
    job.step("rename", lambda: vms.rename_vm(params["vm"], params["name"], actor=job.actor, reason="RAPI rename"))


class GroupParams(serializers.Serializer):
    group = serializers.IntegerField(min_value=1)
    alloc_policy = serializers.ChoiceField(choices=NodeGroup.AllocPolicy.values)


class AssignParams(serializers.Serializer):
    group = serializers.IntegerField(min_value=1, allow_null=True, help_text="None: the implicit default group.")
    hypervisors = serializers.ListField(child=serializers.IntegerField(min_value=1), min_length=1, max_length=1000)


@opcode("group.modify", params=GroupParams, staff_only=True)
def group_modify(job):
    """Set a node group's allocation policy (Ganeti's OP_GROUP_SET_PARAMS); returns the changes."""
    params = job.params
    return job.step("modify", lambda: services.modify_group(params["group"], params["alloc_policy"], actor=job.actor))


@opcode("group.assign_nodes", params=AssignParams, staff_only=True)
def group_assign_nodes(job):
    """Move hosts into a node group, or out of every group (Ganeti's OP_GROUP_ASSIGN_NODES)."""
    params = job.params
    job.step("assign", lambda: services.assign_nodes(params["group"], params["hypervisors"], actor=job.actor))


class MultiAllocParams(serializers.Serializer):
    jobs = serializers.ListField(child=serializers.IntegerField(min_value=1), max_length=100)
    allocatable = StringListField(max_length=100)
    failed = StringListField(max_length=100)


@opcode("instance.multi_alloc", params=MultiAllocParams, staff_only=True)
def instance_multi_alloc(job):
    """Report a multi-allocation (Ganeti's OP_INSTANCE_MULTI_ALLOC): the create jobs were
    submitted with it; its result lists them as Ganeti's does."""
    params = job.params
    return {
        "jobs": [[True, pk] for pk in params["jobs"]],
        "allocatable": params["allocatable"],
        "failed": params["failed"],
    }
