"""The verify report's repairs as jobs (administrators only, ``capability="admin"``; an admin
confirms each on the page or asks through the API):
``repair.adopt``, ``repair.destroy``, ``repair.drift``, ``repair.absent``.
One step each; the work and its rules are in ``provisioning.repair``."""

from rest_framework import serializers

from jobs.registry import opcode
from provisioning import repair
from provisioning.opcodes.params import VMParams, vm_lock


class UnknownParams(serializers.Serializer):
    hypervisor = serializers.IntegerField(min_value=1)
    key = serializers.CharField(max_length=200, help_text="The VM's name on the hypervisor.")


class AdoptParams(UnknownParams):
    owner = serializers.IntegerField(
        min_value=1, required=False, allow_null=True, default=None, help_text="User id (default: the admin)."
    )
    image = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        default=None,
        help_text="Image id to record it with (default: the inactive 'adopted').",
    )


class DestroyParams(UnknownParams):
    force = serializers.BooleanField(default=False, help_text="Needed for a name that is not vclmgr's.")


class GoneParams(VMParams):
    reason = serializers.CharField(max_length=400, required=False, default="", allow_blank=True)


def unknown_lock(params):
    return [(f"hypervisor:{params['hypervisor']}", "shared"), f"unknown-vm:{params['hypervisor']}:{params['key']}"]


@opcode("repair.adopt", params=AdoptParams, locks=unknown_lock, staff_only=True, capability="admin")
def repair_adopt(job):
    """Adopt an unknown VM: a vclmgr VM row of its size with a claim on its host."""
    p = job.params
    owner = p["owner"] or job.job.submitter_id  # default: the admin who asked for it
    return job.step("adopt", repair.adopt, p["hypervisor"], p["key"], owner, p["image"], actor=job.actor)


@opcode("repair.destroy", params=DestroyParams, locks=unknown_lock, staff_only=True, capability="admin")
def repair_destroy(job):
    """Destroy an unknown VM through its host's driver (a foreign name only with force)."""
    p = job.params
    return job.step("destroy", repair.destroy, p["hypervisor"], p["key"], p["force"], actor=job.actor)


@opcode("repair.drift", params=VMParams, locks=vm_lock, staff_only=True, capability="admin")
def repair_drift(job):
    """The database takes the hypervisor's state of the VM."""
    return job.step("drift", repair.take_host_state, job.params["vm"], actor=job.actor)


@opcode("repair.absent", params=GoneParams, locks=vm_lock, staff_only=True, capability="admin")
def repair_absent(job):
    """Mark a VM its host does not run as gone: claims released, its reservation ended."""
    return job.step("absent", repair.mark_gone, job.params["vm"], job.params["reason"], actor=job.actor)
