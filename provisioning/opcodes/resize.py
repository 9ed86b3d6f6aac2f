"""``vm.resize``: a built VM's vCPUs and memory changed, its claim first (``provisioning.resizing``)."""

from drivers import registry as drivers
from jobs.registry import opcode
from provisioning import resizing
from provisioning.opcodes.common import fail_reason, load_vm, passes_through
from provisioning.opcodes.params import ResizeParams, vm_lock

# Ganeti's names of what OP_INSTANCE_SET_PARAMS changed (its result lists ``[name, value]``).
GANETI_NAMES = {"vcpus": "be/vcpus", "memory_mib": "be/maxmem"}


@opcode("vm.resize", params=ResizeParams, locks=vm_lock, staff_only=True)
def vm_resize(job):
    """Change a VM's vCPUs and memory: its claim on its host, then its definition."""
    vm_id = job.params["vm"]
    size = {name: job.params[name] for name in resizing.FIELDS}
    job.expect(3)
    claimed = job.db_step("claim", resizing.claim, vm_id, size, actor=job.actor)
    old = claimed["old"]
    if claimed["from"] == claimed["to"]:
        return {"vm": vm_id, **size, "applies": None, "changes": []}
    try:
        applies = job.step("apply", apply, vm_id, size)
    except Exception as exc:
        if not passes_through(exc):
            # A driver whose wait gave up may still have made the change (a vSphere task that
            # completes late): the claim keeps whatever size the host now reports, if larger.
            reported = resizing.reported_size(vm_id)
            resizing.undo(vm_id, claimed, fail_reason(exc), actor=job.actor, reported=reported)
        raise
    job.db_step("record", resizing.record, vm_id, size, applies, actor=job.actor)
    changes = [[GANETI_NAMES[name], size[name]] for name in resizing.FIELDS if size[name] != old[name]]
    return {"vm": vm_id, **size, "applies": applies, "changes": changes}


def apply(vm_id, size):
    """The driver's ``resize`` of the VM's persistent definition; its answer (``now``/``next boot``)."""
    vm = load_vm(vm_id)
    return drivers.driver_for(vm.host).resize(vm.key, size["vcpus"], size["memory_mib"])
