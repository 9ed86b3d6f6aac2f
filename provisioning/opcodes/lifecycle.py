"""The VM lifecycle: ``vm.create`` (with one retry on another host), ``vm.destroy``, power
(``vm.start``/``stop``/``suspend``/``resume``), ``vm.snapshot`` and ``vm.revert``."""

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from capacity import services as capacity
from core.hooks import Hook
from drivers import base
from drivers import registry as drivers
from inventory.models import Hypervisor
from jobs import reasons as job_reasons
from jobs.models import Job
from jobs.registry import opcode
from placement import devices
from provisioning import private_networks, services
from provisioning.models import VM, ImageVariant
from provisioning.opcodes import guest
from provisioning.opcodes.common import (
    POLL_SECONDS,
    Refused,
    S,
    authorised_vm,
    fail_reason,
    keeps_variant,
    load_vm,
    passes_through,
    variant_for,
)
from provisioning.opcodes.params import CreateParams, SnapshotParams, StopParams, VMParams, vm_lock
from provisioning.opcodes.power import AFTER_POWER_ON, host_for_vm
from provisioning.opcodes.staging import stage

RETRY_STEPS = ("claim", "define", "clean", "start", "address")  # a failure here is retried once on another host
# What follows from a vm.create's success, registered by the apps above (reservations: its
# reservation turns ready): ``hook(vm, job_id, actor=)`` in the transaction that makes the VM
# ready and ends the job, which holds the queue lock; rolled back with it if the lease was lost.
ON_BUILT: Hook[Callable[..., None]] = Hook("provisioning.opcodes.lifecycle.ON_BUILT")
# The warm path of a vm.create (``opcodes.warm.start``, which builds on this module, registers
# itself): ``start(job, vm)`` → the job's result, or None when it fell back to the cold build.
WARM_START: Hook[Callable[..., dict | None]] = Hook("provisioning.opcodes.lifecycle.WARM_START", single=True)

logger = logging.getLogger(__name__)


@opcode("vm.create", params=CreateParams, locks=vm_lock, staff_only=False)
def vm_create(job):
    """Create a VM: claim capacity, stage its image, define, snapshot it clean (an image that
    reverts on end), boot, wait for its address.

    A placement or boot failure (a claim that lost every race, or a failure to define, start
    or address the VM) is retried once on another host, after the first host is cleaned and
    its claim released; the retry is recorded in the job's reason trail and log.

    ``warm``: the VM was taken from its image's warm pool (``opcodes.warm.start``): the login is
    handed to its running guest; if that fails, the same VM is built cold as above.
    """
    vm = authorised_vm(job, building=True)
    vm_id = vm.pk
    warm_start = WARM_START.one()
    if job.params.get("warm") and "cold" not in job._done and vm.state == S.STARTING and warm_start:
        done = warm_start(job, vm)
        if done is not None:
            return done
        vm = authorised_vm(job, building=True)
    if vm.state in (S.RUNNING, S.STOPPED, S.SUSPENDED, S.MIGRATING):  # a repeated create: it exists
        return {"vm": vm_id, "host": vm.host_id, "address": vm.address, "already": True}
    if vm.state == S.DESTROYED:
        raise Refused(f"{vm.key} is destroyed: request a new VM")
    refuse_superseded(vm)
    job.expect(7)
    retried = job._done.get("retry")  # a re-run after the retry began goes straight to the second attempt
    first = None
    if retried is None:
        attempt = Attempt(job, vm_id, loaded=vm, last=True)
        try:
            return attempt.run()
        except Exception as exc:
            if passes_through(exc):
                raise
            if not attempt.retryable(exc):
                undo_create(vm_id, fail_reason(exc), actor=job.actor)
                raise
            first = exc
            try:
                retried = _retry(job, vm_id, attempt.at, fail_reason(exc))
            except Exception as cleanup:  # the first host could not be cleaned: no retry, fail as usual
                if passes_through(cleanup):
                    raise
                undo_create(vm_id, fail_reason(exc), actor=job.actor)
                raise exc from cleanup
    job.expect(len(job._done) + 7)
    attempt = Attempt(job, vm_id, suffix="-retry", exclude=retried["exclude"], last=True)
    try:
        return attempt.run()
    except Exception as exc:
        if passes_through(exc):
            raise
        if attempt.at == "claim" and isinstance(exc, capacity.NoCapacity):  # nowhere else: the first failure stands
            undo_create(vm_id, f"{retried['reason']}; no other host to retry on", actor=job.actor)
            raise (first or base.DriverError(retried["reason"])) from exc
        undo_create(vm_id, fail_reason(exc), actor=job.actor)
        raise


class Attempt:
    """One try at building the VM; ``at`` is the step it reached (the one that failed, on failure)."""

    def __init__(self, job, vm_id, suffix="", exclude=(), loaded=None, rank=None, last=False):
        """``loaded``: the VM as the job just read it (its claim step starts from it, no read again);
        ``rank``: the class of what the VM is for (``preemption.RANKS``): its claim may suspend
        lower-class claims to fit, and the VM is built once they are suspended; ``last``: the job
        ends with the attempt's result (its ready step ends the job, in one transaction)."""
        self.job, self.vm_id, self.suffix, self.exclude = job, vm_id, suffix, exclude
        self.loaded, self.rank, self.last = loaded, rank, last
        self.booted = None  # the VM as the boot's state change wrote it
        self.at = None
        self.placed = None

    def step(self, name, fn, *args, **kwargs):
        self.at = name
        return self.job.step(name + self.suffix, fn, *args, **kwargs)

    def kept_step(self, name, fn, *args, **kwargs):
        """A step whose record the next one's state change writes (``step_recorded_later``)."""
        self.at = name
        return self.job.step_recorded_later(name + self.suffix, fn, *args, **kwargs)

    def db_step(self, name, fn, *args, **kwargs):
        """A step that only touches the database: its writes commit with its lease-fenced record."""
        self.at = name
        return self.job.db_step(name + self.suffix, fn, *args, **kwargs)

    def run(self):
        vm_id, actor = self.vm_id, self.job.actor
        if self.loaded is None:  # read once: the claim, the stage step and the image's settings go on from it
            self.loaded = load_vm(vm_id)
        if adopts(self.loaded):  # a reservation's claim: nothing to write, its record rides on define's
            placing = copy.copy(self.loaded)  # placed in memory; ``loaded`` stays as read (define writes from it)
            self.placed = self.kept_step("claim", adopt, placing)
        else:
            placing = self.loaded
            self.placed = self.db_step(
                "claim", claim, vm_id, self.exclude, actor=actor, loaded=self.loaded, rank=self.rank
            )
        placement = self._placement(placing)
        for n in range(ROOM_STEPS):  # their memory is given back on the host only when they are suspended
            if not self.placed.get("after") or self.step(f"room-{n}", suspensions_ended, self.placed["after"]):
                break
        else:
            waited = ROOM_STEPS * ROOM_STEP_SECONDS
            raise Refused(f"the claims suspended to make room for it were not suspended within {waited} s")
        woken = None
        if self.placed.get("standby"):  # recorded by the claim step, so a replay takes the same path
            woken = self.step("power", host_for_vm, self.placed["host"], vm_id, not self.continued(), actor=actor)
        if woken:  # the host is being powered on: go on in a child that waits for that job (any end)
            child = self.job.submit_child(
                "vm.create", {"vm": vm_id}, depends=[[woken["power_on_job"], []]], key=AFTER_POWER_ON
            )
            return {
                "vm": vm_id,
                "host": self.placed["host"],
                "allocation": self.placed["allocation"],
                "after_power_on": woken["power_on_job"],
                "continued_by": child,
            }
        # Each step's record is written by the next one's state change (define's "defining",
        # start's "booting") or by the ready step: a crash in between repeats the step, which
        # finds its work done (a staged image, a defined or running domain).
        self.kept_step("stage", stage, vm_id, self.placed["host"], self.job.job_id, loaded=placing)
        # Define's state change writes from the VM as read (no read again); it is the VM as
        # written after it, which the boot's writes from in turn (else the row is read again).
        defined = self.kept_step("define", define, vm_id, actor=actor, known=self.loaded, **placement)
        image = self.loaded.image
        if image.revert_on_end or image.pool_size:  # an image's, set when it is made (a pool reverts too)
            self.step("clean", clean_snapshot, vm_id, actor=actor)
        self.kept_step("start", self._boot, vm_id, actor=actor, port=defined["port"], known=self.loaded)
        address = self.kept_step("address", wait_address, vm_id, loaded=self.booted)
        built = {"vm": vm_id, "host": self.placed["host"], "allocation": self.placed["allocation"], "address": address}
        if self.last:
            self.at = "ready"
            return self.job.last_db_step(
                "ready" + self.suffix,
                ready,
                vm_id,
                address,
                actor=actor,
                job_id=self.job.job_id,
                job_result=built,
                known=self.booted,
            )
        self.db_step("ready", ready, vm_id, address, actor=actor, known=self.booted)
        return built

    def _placement(self, vm):
        """An adopted claim's host and variant, for define's state change to write (``adopt``
        writes nothing); ``vm`` (the VM as placed) is given them (read here only on a replay of
        the claim step whose VM row does not have them yet)."""
        if not self.placed.get("adopted"):
            return {}
        if vm.host_id != self.placed["host"]:
            vm.host = Hypervisor.objects.select_related("credential").get(pk=self.placed["host"])
        if vm.variant_id != self.placed["variant"]:
            vm.variant = ImageVariant.objects.select_related("image").get(pk=self.placed["variant"])
        return {"host": vm.host, "variant": vm.variant, "revision_id": vm.variant.revision_id}

    def _boot(self, vm_id, **kwargs):
        """``boot``, keeping the VM as it wrote it for the address and ready steps (no read again)."""
        self.booted = booted(vm_id, **kwargs)

    def continued(self):
        """Is this vm.create the one continued after its host's power-on?"""
        return self.job.job.child_key == AFTER_POWER_ON and self.job.job.parent_id is not None

    def retryable(self, exc):
        if self.at not in RETRY_STEPS or isinstance(exc, Refused):
            return False
        if self.at == "claim":
            return isinstance(exc, capacity.TryAgain)
        # A reservation's own claim stays on its host; so does an environment's machine, whose
        # private networks are on that host with the other machines.
        return not self.placed.get("adopted") and not self.loaded.hostname


def _retry(job, vm_id, step, reason):
    host = load_vm(vm_id).host if step != "claim" else None
    note = f"{step} failed{f' on {host.name}' if host else ''} ({reason}); retrying once on another host"
    job.job.reason = [*job.job.reason, job_reasons.entry("vm.create", note)]  # saved with the step's record
    job.log(note, "warning")
    return job.step("retry", retry_elsewhere, vm_id, step, reason, actor=job.actor)


def retry_elsewhere(vm_id, step, reason, *, actor):
    """Clean the first host and release its claim; the second attempt then avoids that host.

    If the first host cannot be cleaned, no retry: the job fails as any failed create does,
    keeping the claim (the VM may still be on that host).
    """
    vm = load_vm(vm_id)
    failed_host = vm.host if step != "claim" else None
    if failed_host is not None:
        drivers.driver_for(failed_host).destroy(vm.key)  # raises: the caller fails the job and keeps the claim
    with transaction.atomic():
        if vm.allocation_id:
            capacity.release(vm.allocation, actor=actor, reason=f"{vm.key}: {step} failed, retrying on another host")
        where = f" on {failed_host.name}" if failed_host else ""
        services.set_state(
            vm_id,
            S.REQUESTED,
            f"{step} failed{where}; retrying on another host",
            host=None,
            allocation=None,
            variant=None,
            error=reason[:4000],
            actor=actor,
        )
    return {"exclude": [failed_host.pk] if failed_host else [], "failed": step, "reason": reason[:1000]}


def adopts(vm):
    """Does the VM come with a live claim on an online host (a reservation's)? Its claim step is
    then ``adopt``: a read, safe to repeat, whose record (and the host and variant it picks)
    define's state change writes, lease-checked, in its transaction."""
    allocation = vm.allocation
    return allocation is not None and allocation.released is None and allocation.host.state == Hypervisor.State.ONLINE


def adopt(vm):
    """``claim`` of a VM that ``adopts`` its claim: the host and variant, set on ``vm`` in memory
    only; the variant (the one the reservation picked, else picked here) comes with whether it
    is staged there (``staged_here``, for the stage step that follows in this run; a replay of
    this step from its record reads again)."""
    host = vm.allocation.host
    if keeps_variant(vm, host):  # picked with the claim (``load_vm(building=True)`` read whether it is staged)
        variant = vm.variant
        if hasattr(vm, "variant_staged"):
            variant.staged_here = vm.variant_staged
    else:
        variant = variant_for(vm, host, staged=True)
    vm.host, vm.variant = host, variant
    return {"host": host.pk, "allocation": vm.allocation_id, "variant": variant.pk, "adopted": True}


def claim(vm_id, exclude=(), *, actor, loaded=None, rank=None):
    """Claim capacity for the VM (or adopt the allocation it came with) and pick its variant.

    ``exclude``: ids of hosts not to use (where a first attempt failed). ``loaded``: the VM as
    read by this run just before (``load_vm``), else it is read here. ``rank``: the claim's
    class; when it fits only by suspending lower-class claims, ``after`` lists the jobs that
    suspend them.
    """
    vm = loaded or load_vm(vm_id)
    held = vm.allocation if vm.allocation_id and vm.allocation.released is None else None
    # A standby host is being powered on for this claim (the "power" step waits for it).
    if held is not None and held.host.state != Hypervisor.State.ONLINE and not held.host.power_standby:
        if vm.hostname:  # moved alone it would leave its networks: its holder builds it again with them
            raise Refused(f"its host {held.host.name} is {held.host.state}; not moved apart from its networks")
        replace_off(vm, actor=actor)  # a reservation's claim on a host drained or taken offline since
        vm = load_vm(vm_id)
    if vm.allocation_id and vm.allocation.released is None:
        host = vm.allocation.host
        variant = vm.variant if keeps_variant(vm, host) else variant_for(vm, host)
        VM.objects.filter(pk=vm_id).update(host=host, variant=variant, revision_id=variant.revision_id)
        vm.host, vm.variant, vm.revision_id = (
            host,
            variant,
            variant.revision_id,
        )  # (``loaded`` goes on to the stage step as written)
        placed = {"host": host.pk, "allocation": vm.allocation_id, "variant": variant.pk, "adopted": True}
        return {**placed, **_standby(host)}
    demand = replace(
        services.vm_demand(vm, purpose=f"vm {vm_id}", exclude_hosts=exclude),
        rank=rank,
        yields=vm.warm == VM.Warm.WARM,  # a warm pool's VM: its claim gives way to any other
    )
    with transaction.atomic():  # the claim and its record on the VM commit together
        allocation = capacity.claim(demand, actor=actor, owner=vm.owner)
        variant = variant_for(vm, allocation.host)
        VM.objects.filter(pk=vm_id).update(
            allocation=allocation, host=allocation.host, variant=variant, revision_id=variant.revision_id
        )
        vm.allocation, vm.host, vm.variant = allocation, allocation.host, variant
        vm.revision_id = variant.revision_id  # the revision it is built from, kept by rebuilds
    after = list(getattr(allocation, "preempt_jobs", ()))
    how = f" ({allocation.placement_note})" if after else ""
    services.set_state(vm_id, S.STAGING, f"placed on {allocation.host.name}{how}", actor=actor, known=vm)
    placed = {"host": allocation.host_id, "allocation": allocation.pk, "variant": variant.pk}
    return {**placed, **_standby(allocation.host), **({"after": after} if after else {})}


ROOM_STEP_SECONDS = 10
ROOM_STEPS = 60  # the suspensions a claim waits for: each ends within a wait step of its run, and a suspend


def suspensions_ended(job_ids):
    """Have the jobs that suspend lower-class VMs for this claim ended (their VMs suspended, or
    gone)? Asked for up to a step's share of time."""
    until = time.monotonic() + ROOM_STEP_SECONDS
    while Job.objects.filter(pk__in=job_ids).exclude(status__in=Job.FINAL).exists():
        if time.monotonic() >= until:
            return False
        time.sleep(POLL_SECONDS)
    return True


def _standby(host):
    """``{"standby": True}`` when the claim is on a host vclmgr powered off (being powered on for it).

    ``host`` was read in this claim step's transaction (with the VM, or by the claim), so its
    state is current."""
    return {"standby": True} if host.state != Hypervisor.State.ONLINE and host.power_standby else {}


def replace_off(vm, *, actor):
    """Move the VM's adopted claim off its host, which no longer takes VMs, before building
    (its holders, the reservation, follow through ``capacity.moved``). ``NoCapacity`` fails the build."""
    old = vm.allocation
    why = f"{old.host.name} is {old.host.state}"
    demand = services.vm_demand(vm, purpose=f"vm {vm.pk}", exclude_hosts=[old.host_id])
    try:
        with transaction.atomic():
            fresh = capacity.replace_claim(old, demand, actor=actor, reason=f"vm {vm.pk}: {why}")
            VM.objects.filter(pk=vm.pk).update(allocation=fresh, host=fresh.host, variant=None)  # chosen there
    except capacity.NoCapacity as exc:
        raise Refused(f"{why} and no other host has room: {exc}") from None
    return fresh


def vm_spec(vm, private_networks=()):
    """What the driver is asked for; ``guest`` carries secrets (a password hash), so the spec
    is made for the call and never stored, logged or put in a job result. ``private_networks``:
    its NICs on its environment's networks (``private_networks.ensure``)."""
    return base.VMSpec(
        private_networks=private_networks,
        key=vm.key,
        vcpus=vm.vcpus,
        memory_mib=vm.memory_mib,
        disk_gib=vm.disk_gib,
        image=services.spec(vm.variant),
        extra={"guest_port": services.login_port(vm.image)},
        guest=guest.guest_login(vm),
        gpus=claimed_gpus(vm.allocation),
    )


def claimed_gpus(allocation):
    """Model → count of the GPUs the VM's claim holds (its ``gpu:<model>`` resources)."""
    extras = allocation.extras if allocation is not None else {}
    return {model: int(n) for name, n in sorted(extras.items()) if n and (model := devices.model_of(name))}


def superseded(vm):
    """Is the VM to be destroyed before it was built (a ``vm.destroy`` of it queued: an
    environment's machine built again elsewhere with another that failed)? Its build must then
    define nothing on its host. Asked only of an environment's machines (a hostname: a query
    more on their builds alone), the builds another one supersedes while they wait or run."""
    if not vm.hostname:
        return False
    pending = Job.objects.filter(opcode="vm.destroy", params__vm=vm.pk).exclude(status__in=Job.FINAL)
    return pending.exists()


def refuse_superseded(vm):
    if superseded(vm):
        raise Refused(f"{vm.key} is to be destroyed (built again as another VM): not building it")


def define(vm_id, *, actor, known=None, **fields):
    """``fields``: more to write with the state (an adopted claim's host and variant); ``known``:
    see ``services.set_state`` (written from it, it is the VM as written). A superseded VM is
    refused first: its build may have started before it was superseded."""
    refuse_superseded(known if known is not None else load_vm(vm_id))
    vm = services.set_state(vm_id, S.DEFINING, "defining on the host", actor=actor, known=known, **fields)
    driver = drivers.driver_for(vm.host)
    info = driver.create(vm_spec(vm, private_networks.ensure(vm, driver)))
    port = driver.port(vm.key, services.login_port(vm.image))  # written with the boot's state (no write of its own)
    return {"key": info.key, "host": info.host, "port": port}


def clean_snapshot(vm_id, *, actor):
    """The state a ``revert_on_end`` (or pooled) VM returns to after each user: defined, never booted, so
    it holds no one's login (a snapshot after the first boot would keep the first user's)."""
    vm = load_vm(vm_id)
    drivers.driver_for(vm.host).snapshot(vm.key, services.CLEAN_SNAPSHOT)
    clean = {"name": services.CLEAN_SNAPSHOT, "state": S.STOPPED, "created": timezone.now().isoformat()}
    others = [s for s in vm.snapshots if s.get("name") != services.CLEAN_SNAPSHOT]
    VM.objects.filter(pk=vm_id).update(snapshots=[*others, clean])


def warm_snapshot(vm_id, *, actor):
    """A running snapshot (memory included) of a VM just booted for a pooled image's run, before
    anything of the run goes in: its next runs start from here without a boot. Only for a VM
    seeded with no login (a run's), so the snapshot holds no one's secrets."""
    vm = load_vm(vm_id)
    drivers.driver_for(vm.host).snapshot(vm.key, services.WARM_SNAPSHOT)
    warm = {"name": services.WARM_SNAPSHOT, "state": S.RUNNING, "created": timezone.now().isoformat()}
    others = [s for s in vm.snapshots if s.get("name") != services.WARM_SNAPSHOT]
    VM.objects.filter(pk=vm_id).update(snapshots=[*others, warm])


def boot(vm_id, *, actor, **fields):
    """``fields``: more to write with the state (the port ``define`` found)."""
    booted(vm_id, actor=actor, **fields)


def booted(vm_id, *, actor, known=None, **fields):
    """``boot``; returns the VM as written (``load_vm``'s). ``known``: see ``services.set_state``."""
    vm = services.set_state(vm_id, S.STARTING, "booting", actor=actor, known=known, **fields)
    drivers.driver_for(vm.host).start(vm.key)
    return vm


def wait_address(vm_id, loaded=None):
    """The VM's address, once its guest answers there (drivers that boot real guests: ready
    means reachable; the simulators' VMs are ready when they have an address). ``loaded``: the
    VM as this run just wrote it, else it is read."""
    vm = loaded or load_vm(vm_id)
    driver = drivers.driver_for(vm.host)
    deadline = time.monotonic() + settings.VCLMGR_ADDRESS_TIMEOUT
    while True:
        address = driver.address(vm.key)
        if address:
            break
        if driver.boots_guests:
            guest.check_running(vm, driver)
        if time.monotonic() > deadline:
            raise base.DriverError(
                f"{vm.key} got no address within {settings.VCLMGR_ADDRESS_TIMEOUT} s", permanent=False
            )
        time.sleep(POLL_SECONDS)
    if driver.boots_guests:
        guest.wait_answer(vm, address, driver)
    return address


def ready(vm_id, address, *, actor, job_id=None, known=None):
    """``job_id``: the vm.create job this is the last step of (``ON_BUILT`` is told); ``known``:
    see ``services.set_state``."""
    vm = services.set_state(vm_id, S.RUNNING, "ready", address=address, error="", actor=actor, known=known)
    if job_id is not None:
        for hook in ON_BUILT:
            hook(vm, job_id, actor=actor)


def undo_create(vm_id, reason, *, actor):
    """Destroy whatever a failed create made on the host and release its claim; if the
    host cannot be cleaned, the VM is ``error`` and keeps its claim (``cleanup_failed``)."""
    vm = load_vm(vm_id)
    if vm.host_id:
        try:
            drivers.driver_for(vm.host).destroy(vm.key)
        except Exception as exc:  # noqa: BLE001 (keep the claim: the VM may still use the host)
            services.cleanup_failed(vm_id, f"{reason}; cleanup failed, run vm.destroy: {exc}", actor=actor)
            return
    services.fail_build(vm_id, reason, "create failed", actor=actor)
    _drop_networks(vm)


@opcode("vm.destroy", params=VMParams, locks=vm_lock, staff_only=False)
def vm_destroy(job):
    """Destroy a VM on its host and release its claim. If the host's driver fails (an error,
    no answer), the claim stays and the VM is ``error`` until a later destroy succeeds."""
    vm = authorised_vm(job)
    job.expect(2)
    try:
        job.step("destroy", destroy_on_host, vm.pk)
    except Exception as exc:
        if not passes_through(exc):
            services.cleanup_failed(vm.pk, f"destroy failed: {fail_reason(exc)}", actor=job.actor)
        raise
    job.step("release", release, vm.pk, actor=job.actor)
    return {"vm": vm.pk}


def destroy_on_host(vm_id):
    vm = load_vm(vm_id)
    if vm.host_id and vm.state != S.DESTROYED:
        drivers.driver_for(vm.host).destroy(vm.key)


def release(vm_id, *, actor):
    """Give the destroyed VM's claims back and mark it destroyed, in one transaction."""
    vm = load_vm(vm_id)
    with transaction.atomic():
        for allocation in (vm.allocation, vm.target_allocation):
            if allocation is not None:
                capacity.release(allocation, actor=actor, reason=f"{vm.key} destroyed")
        services.set_state(vm_id, S.DESTROYED, "destroyed", address=None, target_allocation=None, actor=actor)
    _drop_networks(vm)


def _drop_networks(vm):
    """An environment machine's networks once it is gone for good (destroyed or failed, as
    committed): the last of its machines to get here removes each one, whichever order their
    teardowns ran in (each one sees the others' ends). A machine gone before its build reached a
    host (a retry elsewhere, an end while it was queued) asks the host its networks were recorded
    on: they may have no other member to remove them."""
    if not vm.hostname:
        return
    host = vm.host
    if host is None:
        network = vm.networks.filter(removed__isnull=True).select_related("host").first()
        host = network.host if network is not None else None
    if host is not None:
        private_networks.drop_unused(vm, drivers.driver_for(host))


POWER = {"start": S.RUNNING, "stop": S.STOPPED, "suspend": S.SUSPENDED, "resume": S.RUNNING}


def _power_opcode(action):
    @opcode(
        f"vm.{action}",
        params=StopParams if action == "stop" else VMParams,
        locks=vm_lock,
        staff_only=False,
        description=f"{action.capitalize()} a VM.",
    )
    def run(job):
        vm = authorised_vm(job)
        state = job.step(action, power, vm.pk, action, job.params.get("force", False), actor=job.actor)
        return {"vm": vm.pk, "state": state}

    return run


def power(vm_id, action, force, *, actor):
    vm = load_vm(vm_id)
    if vm.state not in (S.RUNNING, S.STOPPED, S.SUSPENDED):
        raise Refused(f"cannot {action} {vm.key}: it is {vm.state}")
    refusal = services.run_refusal(vm, action)  # again here: the claim may have gone since it was asked
    if refusal:
        raise Refused(refusal)
    driver = drivers.driver_for(vm.host)
    if action == "stop":
        driver.stop(vm.key, force=force)
    else:
        getattr(driver, action)(vm.key)
    address = driver.address(vm.key) if POWER[action] == S.RUNNING else vm.address
    services.set_state(vm_id, POWER[action], action, address=address, actor=actor)
    return POWER[action]


for _action in POWER:
    _power_opcode(_action)


@opcode("vm.snapshot", params=SnapshotParams, locks=vm_lock, staff_only=False)
def vm_snapshot(job):
    """Take a named snapshot of a VM."""
    vm = authorised_vm(job)
    job.step("snapshot", snapshot, vm.pk, job.params["name"], actor=job.actor)
    return {"vm": vm.pk, "snapshot": job.params["name"]}


def snapshot(vm_id, name, *, actor):
    vm = load_vm(vm_id)
    drivers.driver_for(vm.host).snapshot(vm.key, name)
    snaps = [s for s in vm.snapshots if s.get("name") != name]
    # The size it is taken at: a revert gives its definition the VM's size again, and refuses a
    # running guest that would come back larger than the VM's claim (``revert``).
    taken = {
        "name": name,
        "state": vm.state,
        "size": [vm.vcpus, vm.memory_mib],
        "created": timezone.now().isoformat(),
    }
    services.set_state(vm_id, vm.state, f"snapshot {name}", snapshots=[*snaps, taken], actor=actor)


@opcode("vm.revert", params=SnapshotParams, locks=vm_lock, staff_only=False)
def vm_revert(job):
    """Roll a VM back to a named snapshot."""
    vm = authorised_vm(job)
    state = job.step("revert", revert, vm.pk, job.params["name"], actor=job.actor, log=job.log)
    return {"vm": vm.pk, "state": state}


REVERT_RUNNING = (S.RUNNING, S.SUSPENDED)


def revert(vm_id, name, *, actor, log=None):
    vm = load_vm(vm_id)
    refusal = services.run_refusal(vm, "revert")
    if refusal:
        raise Refused(refusal)
    snap = next((snap for snap in vm.snapshots if snap.get("name") == name), {})
    taken_at = snap.get("size")
    refusal = larger_than_claim(vm, snap)
    if refusal:
        raise Refused(refusal)
    driver = drivers.driver_for(vm.host)
    driver.revert(vm.key, name)
    if taken_at and taken_at != [vm.vcpus, vm.memory_mib]:  # taken before a resize: its definition had that size
        try:
            driver.resize(vm.key, vm.vcpus, vm.memory_mib)
        except Exception as exc:
            # The hypervisor has reverted (a running VM's definition may refuse a change without
            # hot-add): its state must still be recorded below; the size is left to fix by hand,
            # said where an operator looks.
            note = (
                f"reverted {vm.key} to {name}, but its size could not be set back to {vm.vcpus} vCPUs, "
                f"{vm.memory_mib} MiB ({exc}): its definition has the snapshot's {taken_at[0]} vCPUs, "
                f"{taken_at[1]} MiB; resize it again once it is stopped"
            )
            logger.warning(note)
            if log is not None:
                log(note, "warning")
    state = {base.VMState.RUNNING: S.RUNNING, base.VMState.SUSPENDED: S.SUSPENDED}.get(driver.state(vm.key), S.STOPPED)
    address = driver.address(vm.key) if state == S.RUNNING else vm.address
    services.set_state(vm_id, state, f"reverted to {name}", address=address, actor=actor)
    return state


def larger_than_claim(vm, snap):
    """Why a revert to ``snap`` is refused, or None: a snapshot of a running or suspended guest
    brings back the memory and vCPUs it was running with; larger than the VM's claim now (it
    was stopped and shrunk since), the host would run more than it counts."""
    taken_at, held = snap.get("size"), vm.allocation
    if snap.get("state") not in REVERT_RUNNING or not taken_at or held is None:
        return None
    over = [
        f"{value} {unit}"
        for value, claimed, unit in zip(taken_at, (held.vcpus, held.memory_mib), ("vCPUs", "MiB"), strict=True)
        if value > claimed
    ]
    if not over:
        return None
    return (
        f"cannot revert {vm.key} to {snap.get('name')}: it was taken {snap.get('state')} at {' and '.join(over)}, "
        f"more than {vm.key} holds now ({held.vcpus} vCPUs, {held.memory_mib} MiB); "
        "resize the VM to at least that first, or revert to a snapshot taken while it was stopped"
    )
