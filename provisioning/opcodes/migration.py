"""``vm.migrate``: move a VM to another host, claiming the target first and giving the
source's capacity back only once the VM runs there."""

from django.db import transaction

from capacity import services as capacity
from drivers import base
from drivers import registry as drivers
from inventory.models import Hypervisor
from jobs.registry import opcode
from provisioning import plans, services
from provisioning.models import VM
from provisioning.opcodes.common import Refused, S, fail_reason, load_vm, passes_through
from provisioning.opcodes.params import MigrateParams, vm_lock
from provisioning.opcodes.staging import stage


@opcode("vm.migrate", params=MigrateParams, locks=vm_lock, staff_only=True)
def vm_migrate(job):
    """Move a VM to another host (the target given, or the best other one)."""
    vm = load_vm(job.params["vm"])
    if vm.state not in (S.RUNNING, S.STOPPED, S.SUSPENDED, S.MIGRATING):
        raise Refused(f"cannot migrate {vm.key}: it is {vm.state}")
    job.expect(5 if job.params.get("plan") else 4)
    try:
        plan = job.step("claim-target", claim_target, vm.pk, job.params.get("target"), actor=job.actor)
        job.step("stage-target", stage, vm.pk, plan["target"], job.job_id)
        measured = job.step("migrate", move, vm.pk, plan["target"], actor=job.actor)
    except Exception as exc:
        if passes_through(exc):
            raise
        undo_migrate(vm.pk, plan_state(job, vm), fail_reason(exc), actor=job.actor)
        if job.params.get("plan"):
            plans.record_move(job.params["plan"], job.job_id, "error", fail_reason(exc))
        raise
    job.step("switch", switch, vm.pk, plan["state"], actor=job.actor)
    if job.params.get("plan"):
        job.step("plan", plans.record_move, job.params["plan"], job.job_id, "success")
    result = {"vm": vm.pk, "from": vm.host_id, "to": plan["target"]}
    return {**result, "migration": measured} if measured else result


def plan_state(job, vm):
    recorded = job._done.get("claim-target")  # the VM's state before the move, if recorded
    return recorded["state"] if recorded else (vm.state if vm.state != S.MIGRATING else S.STOPPED)


def claim_target(vm_id, target_id, *, actor):
    vm = load_vm(vm_id)
    if vm.target_allocation_id and vm.target_allocation.released is None:
        return {"target": vm.target_allocation.host_id, "allocation": vm.target_allocation_id, "state": vm.state}
    # The disk exists in its variant's format only; the source host is no target (pack would pick it).
    demand = services.vm_demand(
        vm,
        purpose=f"vm {vm_id} (migration)",
        hypervisors=[vm.variant.hypervisor_type],
        exclude_hosts=[vm.host_id],
        prefer_cached=False,
    )
    with transaction.atomic():
        if target_id:
            target = Hypervisor.objects.filter(pk=target_id).first()
            if target is None:
                raise Refused(f"no hypervisor {target_id}")
            if target.state != Hypervisor.State.ONLINE:
                raise Refused(f"cannot migrate to {target.name}: it is {target.state}")
            allocation = capacity.claim_on_host(target, demand, actor=actor, owner=vm.owner)
        else:
            allocation = capacity.claim(demand, actor=actor, owner=vm.owner)
        if allocation.host_id == vm.host_id:
            raise Refused(f"{vm.key} is on {vm.host.name} already")  # the target given; rolls back the claim
        if allocation.host.driver != vm.host.driver:
            raise Refused(f"cannot migrate from a {vm.host.driver} host to a {allocation.host.driver} host")
        VM.objects.filter(pk=vm_id).update(target_allocation=allocation)
    return {"target": allocation.host_id, "allocation": allocation.pk, "state": vm.state}


def move(vm_id, target_id, *, actor):
    vm = load_vm(vm_id)
    target = Hypervisor.objects.select_related("credential").get(pk=target_id)
    services.set_state(vm_id, S.MIGRATING, f"migrating to {target.name}", actor=actor)
    return drivers.driver_for(vm.host).migrate(vm.key, drivers.driver_for(target)) or None


def switch(vm_id, state, *, actor):
    """Record the VM on the target and give the source's capacity back."""
    vm = load_vm(vm_id)
    if vm.target_allocation_id is None:
        return  # switched already
    target = vm.target_allocation.host
    driver = drivers.driver_for(target)
    address = driver.address(vm.key) if state == S.RUNNING else vm.address
    old = vm.allocation
    with transaction.atomic():
        services.set_state(
            vm_id,
            state,
            f"migrated to {target.name}",
            host=target,
            allocation=vm.target_allocation,
            target_allocation=None,
            address=address,
            actor=actor,
        )
        if old is not None:
            capacity.release(old, actor=actor, reason=f"{vm.key} migrated to {target.name}")
            capacity.moved(old, vm.target_allocation, actor=actor)


def undo_migrate(vm_id, state, reason, *, actor):
    vm = load_vm(vm_id)
    if vm.target_allocation_id is None:
        services.set_state(vm_id, state, "migration failed", error=reason[:4000], actor=actor)
        return
    target = vm.target_allocation.host
    try:
        arrived = drivers.driver_for(target).state(vm.key) != base.VMState.ABSENT
    except Exception as exc:  # noqa: BLE001 (the target is down or does not answer)
        if not _runs_on_source(vm, state):  # cannot tell where it is: keep both claims for repair
            why = f"{reason}; cannot tell whether it reached {target.name} ({fail_reason(exc)}): both claims kept"
            services.cleanup_failed(vm_id, why, actor=actor)
            return
        # It runs on the source: libvirt resumed it there, having seen the migration fail.
        # What the target may have of it is an incoming domain never resumed (or, if the
        # target finished the migration and its answer was lost, one verify finds as
        # unknown); the target's claim goes, as after any failed migration.
        arrived = False
        reason = f"{reason}; {target.name} did not answer afterwards ({fail_reason(exc)})"
    if arrived:  # the move itself happened: finish it rather than lose track of the VM
        switch(vm_id, state, actor=actor)
        return
    capacity.release(vm.target_allocation, actor=actor, reason=f"{vm.key}: migration failed")
    services.set_state(vm_id, state, "migration failed", target_allocation=None, error=reason[:4000], actor=actor)


def _runs_on_source(vm, state):
    """True when the VM ran before the move and its source host says it runs there still."""
    try:
        return state == S.RUNNING and drivers.driver_for(vm.host).state(vm.key) == base.VMState.RUNNING
    except Exception:  # noqa: BLE001 (the source does not answer either)
        return False
