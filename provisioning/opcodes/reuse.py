"""Reusing a VM of a ``revert_on_end`` image: ``vm.park`` after one user, ``vm.reuse`` for the next.

The clean snapshot is taken by ``vm.create`` after the VM is defined and before its first
boot (``lifecycle.clean_snapshot``), so it holds no user's login, files or memory.

- ``vm.park``: power off, revert to that snapshot (stopped, as before the first boot), and
  remove the last user's seed (it holds their password hash). The VM stays on its host,
  stopped and owned by no one, waiting for its next user, on a claim of its disk alone
  (``services.park``: it may not run on it) in place of the one it ran on.
- ``vm.reuse``: a parked VM handed to a new owner (``services.reuse_parked`` attached the new
  claim and released the parked one): a fresh seed with the new user's login and a new
  instance id (the guest applies a seed once per instance id), boot, and ready once the
  guest answers — as ``vm.create`` does. On failure the VM is destroyed and its claim
  released, as a failed create, so the caller's retry path builds a new VM.
"""

from contextlib import contextmanager

from drivers import base
from drivers import registry as drivers
from jobs.registry import opcode
from provisioning import services
from provisioning.opcodes import guest
from provisioning.opcodes.common import Refused, S, authorised_vm, fail_reason, load_vm, passes_through
from provisioning.opcodes.lifecycle import boot, ready, revert, undo_create, wait_address
from provisioning.opcodes.params import VMParams, vm_lock


@opcode("vm.park", params=VMParams, locks=vm_lock, staff_only=False)
def vm_park(job):
    """Revert a VM to its clean snapshot, stopped and without the last user's seed."""
    vm = authorised_vm(job)
    if not services.has_clean_snapshot(vm):
        raise Refused(f"{vm.key} has no clean snapshot taken before its first boot to revert to")
    job.expect(5)
    roll_back(job.step, vm.pk, actor=job.actor)
    job.step("park", _park, vm.pk, actor=job.actor)
    return {"vm": vm.pk, "state": S.STOPPED}


def roll_back(step, vm_id, *, actor):
    """Back to the clean snapshot, stopped, with no one's seed: the steps of ``vm.park`` before
    the claim changes (a run's job takes them too, to pool its VM). ``step(name, fn, *args)``."""
    # Off first: a suspended VM's saved memory would outlive the revert of its disk.
    step("stop", _power_off, vm_id, actor=actor)
    step("revert", revert, vm_id, services.CLEAN_SNAPSHOT, actor=actor)
    step("stopped", _power_off, vm_id, actor=actor)
    step("unseed", reseed, vm_id, None, actor=actor)


@opcode("vm.reuse", params=VMParams, locks=vm_lock, staff_only=False)
def vm_reuse(job):
    """Give a parked VM its new owner's login (a fresh seed), boot it and wait until it answers."""
    vm_id = job.params["vm"]
    vm = authorised_vm(job)
    if vm.state != S.STOPPED and "reseed" not in job._done:
        raise Refused(f"cannot reuse {vm.key}: it is {vm.state}")
    job.expect(4)
    address = bring_up(job.step, vm_id, actor=job.actor)
    return {"vm": vm_id, "host": vm.host_id, "address": address, "reused": True}


def bring_up(step, vm_id, *, actor):
    """A parked VM's new seed (its owner's login, a new instance id), boot, and ready once the
    guest answers; the address. On failure it is destroyed and its claim released, as a failed
    create (``vm.reuse``'s steps; a run's job takes them too, on a pooled VM)."""
    with _undone_on_failure(vm_id, actor=actor):
        step("reseed", reseed, vm_id, "owner", actor=actor)
        step("start", boot, vm_id, actor=actor)
        address = step("address", wait_address, vm_id)
        step("ready", ready, vm_id, address, actor=actor)
    return address


def resume_warm(step, vm_id, *, actor):
    """A parked VM with a warm snapshot back to that moment, running, its guest already booted
    (no seed: a run's VM has no login); ready once its guest answers; the address. On failure
    it is destroyed and its claim released, as ``bring_up``."""
    with _undone_on_failure(vm_id, actor=actor):
        step("warm", revert, vm_id, services.WARM_SNAPSHOT, actor=actor)
        address = step("address", wait_address, vm_id)
        step("ready", ready, vm_id, address, actor=actor)
    return address


@contextmanager
def _undone_on_failure(vm_id, *, actor):
    """A failure inside destroys the VM and releases its claim, as a failed create does (unless
    the error passes through: a lost lease, a cancel), then goes on up."""
    try:
        yield
    except Exception as exc:
        if not passes_through(exc):
            undo_create(vm_id, fail_reason(exc), actor=actor)
        raise


def _power_off(vm_id, *, actor):
    vm = load_vm(vm_id)
    driver = drivers.driver_for(vm.host)
    if driver.state(vm.key) != base.VMState.STOPPED:
        driver.stop(vm.key, force=True)  # the user's session is over: nothing in it is kept
    services.set_state(vm_id, S.STOPPED, "stopped at its clean state", address=None, actor=actor)


def _park(vm_id, *, actor):
    # No one owns it while it waits: its last user can neither see nor start it any more.
    services.park(vm_id, "parked, clean, for its next user", actor=actor)


def reseed(vm_id, whose, *, actor):
    """``whose``: "owner" (the login of the VM's current user) or None (no seed)."""
    vm = load_vm(vm_id)
    login = guest.guest_login(vm) if whose == "owner" else None
    drivers.driver_for(vm.host).reseed(vm.key, login)
    note = "seeded for its next user" if login is not None else "the last user's seed removed"
    services.set_state(vm_id, S.STOPPED, note, actor=actor)
