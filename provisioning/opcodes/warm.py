"""Warm VMs (``provisioning.warm``): ``vm.warm`` builds one for its image's pool, ``vm.rewarm``
puts one back after its reservation; ``start`` is the warm path of a reservation's ``vm.create``
(``{"warm": true}``) on a VM taken from the pool.

- ``vm.warm``: claim (a claim that yields), stage, define with no seed, boot, wait until the
  guest answers, then the ``warm`` snapshot, running, memory included. On failure the VM is
  destroyed and its claim released, as a failed create.
- ``vm.rewarm``: after its reservation, the VM reverted to its ``warm`` snapshot and back in
  the pool (``warm.back_to_pool``), or destroyed.
- ``start``: the taken VM running again if it is not (resumed, or reverted to its ``warm``
  snapshot after its host lost it), its guest agent answering, the reservation's login and a
  new identity handed over (``Driver.personalise``), ready once its login service answers. On
  any failure (the agent silent, the guest refusing) the warm VM is destroyed on its host and
  the same VM row, still on the reservation's claim, goes back to ``requested`` (``go_cold``):
  ``vm.create`` goes on with the cold build, and the user gets a working login all the same.
"""

import time

from django.db.models import F

from drivers import base
from drivers import registry as drivers
from jobs.registry import opcode
from provisioning import services, warm
from provisioning.models import VM
from provisioning.opcodes import guest, lifecycle
from provisioning.opcodes.common import Refused, S, authorised_vm, fail_reason, load_vm, passes_through
from provisioning.opcodes.params import VMParams, vm_lock

AGENT_SECONDS = 15  # a resumed guest's agent answers at once; silent this long, the VM is built cold


@opcode("vm.warm", params=VMParams, locks=vm_lock)
def vm_warm(job):
    """Build a warm VM for its image's pool: booted with no login, answering, snapshotted running."""
    vm = authorised_vm(job, building=True)
    if vm.warm != VM.Warm.WARM:
        raise Refused(f"{vm.key} is not a warm pool's VM")
    if vm.state in VM.BUILT and services.has_warm_snapshot(vm):
        return {"vm": vm.pk, "host": vm.host_id, "already": True}
    if vm.state in (S.DESTROYED, S.FAILED):
        raise Refused(f"{vm.key} is {vm.state}")
    job.expect(8)
    try:
        built = lifecycle.Attempt(job, vm.pk, loaded=vm).run()
        job.step("warm", lifecycle.warm_snapshot, vm.pk, actor=job.actor)
    except Exception as exc:
        if not passes_through(exc):
            lifecycle.undo_create(vm.pk, fail_reason(exc), actor=job.actor)
        raise
    return {**built, "warm": True}


def start(job, vm):
    """The warm path of ``vm.create``: the job's result once ready, or None when it fell back to
    the cold build (the VM is ``requested`` again, on the same claim)."""
    actor = job.actor
    try:
        job.step("warm-resume", resume, vm.pk)
        job.step("warm-login", hand_over, vm.pk)
        address = job.step("warm-address", lifecycle.wait_address, vm.pk)
        result = {"vm": vm.pk, "host": vm.host_id, "allocation": vm.allocation_id, "address": address, "warm": True}
        return job.last_db_step(
            "warm-ready", lifecycle.ready, vm.pk, address, actor=actor, job_id=job.job_id, job_result=result
        )
    except Exception as exc:
        if passes_through(exc):
            raise
        reason = fail_reason(exc)
        job.log(f"the warm start of {vm.key} failed ({reason}); building it cold", "warning")
        job.step("cold", go_cold, vm.pk, reason, actor=actor)
        return None


lifecycle.WARM_START.register(start)


def resume(vm_id):
    """The taken VM running, its guest agent answering (where the driver reaches one)."""
    vm = load_vm(vm_id)
    driver = drivers.driver_for(vm.host)
    state = driver.state(vm.key)
    if state == base.VMState.SUSPENDED:
        driver.resume(vm.key)
    elif state == base.VMState.STOPPED:  # its host restarted, say: the snapshot has the booted guest
        driver.revert(vm.key, services.WARM_SNAPSHOT)
    elif state != base.VMState.RUNNING:
        raise base.DriverError(f"{vm.key} is {state}", permanent=True)
    if not driver.boots_guests:
        return
    deadline = time.monotonic() + min(AGENT_SECONDS, vm.image.ready_timeout)
    while not driver.agent_answers(vm.key):
        if time.monotonic() > deadline:
            raise base.DriverError(f"the guest agent of {vm.key} did not answer within {AGENT_SECONDS} s")
        time.sleep(0.1)


def hand_over(vm_id):
    """The reservation's login, and a new identity, in the running guest (the login is made for
    the call and never stored: the step records nothing of it)."""
    vm = load_vm(vm_id, building=True)
    login = guest.guest_login(vm)
    if login is None or login.anonymous:
        raise Refused(f"{vm.key} has no login to hand over")
    guest.channel_driver(vm).personalise(vm.key, login)


def go_cold(vm_id, reason, *, actor):
    """The warm VM destroyed on its host; the row ``requested`` again on the same claim, for the
    cold build to go on from (if the host cannot destroy it, the VM is ``error`` and the job fails)."""
    vm = load_vm(vm_id)
    try:
        drivers.driver_for(vm.host).destroy(vm.key)
    except Exception as exc:
        if not passes_through(exc):
            services.cleanup_failed(vm_id, f"{reason}; cleanup failed, run vm.destroy: {exc}", actor=actor)
        raise
    services.set_state(
        vm_id,
        S.REQUESTED,
        f"the warm start failed ({reason}); building it cold"[:500],
        address=None,
        snapshots=[],
        warm=VM.Warm.MISS,
        actor=actor,
    )
    VM.objects.filter(pk=vm_id, warm_takes__gt=0).update(warm_takes=F("warm_takes") - 1)  # a miss, not a hit


@opcode("vm.rewarm", params=VMParams, locks=vm_lock, staff_only=False)
def vm_rewarm(job):
    """After its reservation: a VM taken warm reverted to its warm snapshot and back in its
    image's pool, or destroyed (the pool full, no room for it there, or the revert failed)."""
    vm = authorised_vm(job)
    if vm.warm == VM.Warm.WARM and vm.owner_id is None:  # a re-run after it went back
        return {"vm": vm.pk, "pooled": True}
    job.expect(3)
    try:
        # First, whatever follows: the user's session, files and login go with the revert.
        job.step("revert", lifecycle.revert, vm.pk, services.WARM_SNAPSHOT, actor=job.actor)
        if job.step("pool", warm.back_to_pool, vm.pk, actor=job.actor):
            return {"vm": vm.pk, "pooled": True}
    except Exception as exc:
        if passes_through(exc):
            raise
        job.log(f"{vm.key} could not go back to the warm pool ({fail_reason(exc)}); destroying it", "warning")
    job.step("destroy", lifecycle.destroy_on_host, vm.pk)
    job.step("release", lifecycle.release, vm.pk, actor=job.actor)
    return {"vm": vm.pk, "pooled": False}
