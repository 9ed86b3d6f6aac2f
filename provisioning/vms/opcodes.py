"""VM lifecycle opcodes: every hypervisor call of the VM app runs here, as job steps.

Rules every opcode keeps:

- Each step is idempotent (a retried attempt re-runs an interrupted step): driver calls are
  keyed by the VM's key, claims are written in the transaction that records them on the VM.
- No database transaction is open across a driver call: read, commit, call, then write.
- ``vm.create`` leaves nothing half-made: on any failure it destroys what it defined and
  releases the claim, then fails with the reason (the VM row stays, ``failed``, with it).
- A user may only act on their own VMs, also when submitting through the generic jobs API
  (``_authorise``); staff and system submitters act on any.
"""

import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework import serializers

from inventory import services as inventory
from inventory.models import Hypervisor
from provisioning.capacity import services as capacity
from provisioning.drivers import base, registry
from provisioning.jobs import reasons as job_reasons
from provisioning.jobs.models import QueueSettings
from provisioning.jobs.registry import opcode
from provisioning.jobs.runner import Handoff, LeaseLost
from provisioning.vms import services
from provisioning.vms.models import VM, HostImage, Image

S = VM.State
STAGE_PER_HOST = getattr(settings, "VCLMGR_STAGE_PER_HOST", 2)  # concurrent image transfers per host
STAGE_PER_CHASSIS = getattr(settings, "VCLMGR_STAGE_PER_CHASSIS", 4)  # … per blade center
STAGE_GLOBAL = getattr(settings, "VCLMGR_STAGE_GLOBAL", 16)  # … in all
STAGE_STALE_SECONDS = 600  # a staging slot older than this belongs to a dead worker
STAGE_WAIT_SECONDS = 120
ADDRESS_TIMEOUT_SECONDS = getattr(settings, "VCLMGR_ADDRESS_TIMEOUT", 120)
POLL_SECONDS = 0.2


class Refused(Exception):
    """The job may not do this (wrong owner, wrong state, no variant for the host)."""


# --- parameters and locks -----------------------------------------------------------------


class VMParams(serializers.Serializer):
    vm = serializers.IntegerField(min_value=1)


class StopParams(VMParams):
    force = serializers.BooleanField(default=False)


class SnapshotParams(VMParams):
    name = serializers.RegexField(base.IMAGE_NAME_RE, max_length=100)


class CaptureParams(VMParams):
    image_name = serializers.RegexField(base.IMAGE_NAME_RE, max_length=100)
    force = serializers.BooleanField(default=False, help_text="Pull the plug instead of a guest shutdown.")


class MigrateParams(VMParams):
    target = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)


class HostParams(serializers.Serializer):
    hypervisor = serializers.IntegerField(min_value=1)


class RefreshParams(HostParams):
    drain_unreachable = serializers.BooleanField(default=False)


def vm_lock(params):
    return [f"vm:{params['vm']}"]


def capture_locks(params):
    # Two captures to one new name would share the hypervisor's copy: one at a time per name.
    return [f"vm:{params['vm']}", f"image:{params['image_name']}"]


def host_lock(params):
    return [(f"hypervisor:{params['hypervisor']}", "shared")]


# --- plumbing -----------------------------------------------------------------------------


def driver_for(host):
    credentials = None
    if host.credential_id:
        credentials = {"username": host.credential.username, "password": host.credential.get_secret()}
    # Per-driver options for every host of that driver, e.g. {"vmware": {"insecure": True}}.
    options = dict(getattr(settings, "VCLMGR_DRIVER_OPTIONS", {}).get(host.driver, {}))
    if host.driver == Hypervisor.Driver.SIM:
        options = {
            **options,
            "cpus": host.cpus,
            "memory_mib": host.memory_mib,
            "disk_gib": host.disk_gib,
            **getattr(settings, "VCLMGR_SIM_OPTIONS", {}),
        }
    return registry.get_driver(host.driver, host.connection_uri, credentials, options)


def _vm(vm_id):
    return VM.objects.select_related("host", "host__credential", "variant", "variant__image", "allocation").get(
        pk=vm_id
    )


def _authorise(job, vm):
    submitter = job.job.submitter
    if submitter is not None and not submitter.is_staff and vm.owner_id != submitter.pk:
        raise Refused(f"{submitter.get_username()} may not act on {vm.key}")


def _fail_reason(exc):
    if isinstance(exc, capacity.NoCapacity):
        return f"no capacity: {exc}"
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, base.DriverError) else str(exc)


def _passes_through(exc):
    """Exceptions that mean 'another worker continues this job': never clean up on them."""
    return isinstance(exc, (LeaseLost, Handoff)) or type(exc).__name__ == "TimeoutException"


# --- vm.create ----------------------------------------------------------------------------


RETRY_STEPS = ("claim", "define", "start", "address")  # a failure here is retried once on another host


@opcode("vm.create", params=VMParams, locks=vm_lock, staff_only=False)
def vm_create(job):
    """Create a VM: claim capacity, stage its image, define, boot, wait for its address.

    A placement or boot failure (a claim that lost every race, or a failure to define, start
    or address the VM) is retried once on another host, after the first host is cleaned and
    its claim released; the retry is recorded in the job's reason trail and log.
    """
    vm_id = job.params["vm"]
    vm = _vm(vm_id)
    _authorise(job, vm)
    if vm.state in (S.RUNNING, S.STOPPED, S.SUSPENDED, S.MIGRATING):  # a repeated create: it exists
        return {"vm": vm_id, "host": vm.host_id, "address": vm.address, "already": True}
    if vm.state == S.DESTROYED:
        raise Refused(f"{vm.key} is destroyed: request a new VM")
    job.expect(6)
    retried = job._done.get("retry")  # a re-run after the retry began goes straight to the second attempt
    first = None
    if retried is None:
        attempt = Attempt(job, vm_id)
        try:
            return attempt.run()
        except Exception as exc:
            if _passes_through(exc):
                raise
            if not attempt.retryable(exc):
                undo_create(vm_id, job.actor, _fail_reason(exc))
                raise
            first = exc
            try:
                retried = _retry(job, vm_id, attempt.at, _fail_reason(exc))
            except Exception as cleanup:  # the first host could not be cleaned: no retry, fail as usual
                if _passes_through(cleanup):
                    raise
                undo_create(vm_id, job.actor, _fail_reason(exc))
                raise exc from cleanup
    job.expect(len(job._done) + 6)
    attempt = Attempt(job, vm_id, suffix="-retry", exclude=retried["exclude"])
    try:
        return attempt.run()
    except Exception as exc:
        if _passes_through(exc):
            raise
        if attempt.at == "claim" and isinstance(exc, capacity.NoCapacity):  # nowhere else: the first failure stands
            undo_create(vm_id, job.actor, f"{retried['reason']}; no other host to retry on")
            raise (first or base.DriverError(retried["reason"])) from exc
        undo_create(vm_id, job.actor, _fail_reason(exc))
        raise


class Attempt:
    """One try at building the VM; ``at`` is the step it reached (the one that failed, on failure)."""

    def __init__(self, job, vm_id, suffix="", exclude=()):
        self.job, self.vm_id, self.suffix, self.exclude = job, vm_id, suffix, exclude
        self.at = None
        self.placed = None

    def step(self, name, fn, *args):
        self.at = name
        return self.job.step(name + self.suffix, fn, *args)

    def run(self):
        vm_id, actor = self.vm_id, self.job.actor
        self.placed = self.step("claim", claim, vm_id, actor, self.exclude)
        self.step("stage", stage, vm_id, self.placed["host"], self.job.job_id, actor)
        self.step("define", define, vm_id, actor)
        self.step("start", boot, vm_id, actor)
        address = self.step("address", wait_address, vm_id)
        self.step("ready", ready, vm_id, address, actor)
        return {"vm": vm_id, "host": self.placed["host"], "allocation": self.placed["allocation"], "address": address}

    def retryable(self, exc):
        if self.at not in RETRY_STEPS or isinstance(exc, Refused):
            return False
        if self.at == "claim":
            return isinstance(exc, capacity.TryAgain)
        return not self.placed.get("adopted")  # a reservation's own claim stays on its host


def _retry(job, vm_id, step, reason):
    host = _vm(vm_id).host if step != "claim" else None
    note = f"{step} failed{f' on {host.name}' if host else ''} ({reason}); retrying once on another host"
    job.job.reason = [*job.job.reason, job_reasons.entry("vm.create", note)]  # saved with the step's record
    job.log(note, "warning")
    return job.step("retry", retry_elsewhere, vm_id, step, reason, job.actor)


def retry_elsewhere(vm_id, step, reason, actor):
    """Clean the first host and release its claim; the second attempt then avoids that host.

    If the first host cannot be cleaned, no retry: the job fails as any failed create does,
    keeping the claim (the VM may still be on that host).
    """
    vm = _vm(vm_id)
    failed_host = vm.host if step != "claim" else None
    if failed_host is not None:
        driver_for(failed_host).destroy(vm.key)  # raises: the caller fails the job and keeps the claim
    with transaction.atomic():
        if vm.allocation_id:
            capacity.release(vm.allocation, actor, f"{vm.key}: {step} failed, retrying on another host")
        where = f" on {failed_host.name}" if failed_host else ""
        services.set_state(
            vm_id, S.REQUESTED, actor, f"{step} failed{where}; retrying on another host", host=None, allocation=None,
            variant=None, error=reason[:4000],
        )  # fmt: skip
    return {"exclude": [failed_host.pk] if failed_host else [], "failed": step, "reason": reason[:1000]}


def claim(vm_id, actor, exclude=()):
    """Claim capacity for the VM (or adopt the allocation it came with) and pick its variant.

    ``exclude``: ids of hosts not to use (where a first attempt failed).
    """
    vm = _vm(vm_id)
    if vm.allocation_id and vm.allocation.released is None:
        host = vm.allocation.host
        variant = vm.variant or _variant_for(vm, host)
        VM.objects.filter(pk=vm_id).update(host=host, variant=variant)
        return {"host": host.pk, "allocation": vm.allocation_id, "variant": variant.pk, "adopted": True}
    variants = list(vm.image.variants.all())
    demand = capacity.Demand(
        vcpus=vm.vcpus,
        memory_mib=vm.memory_mib,
        disk_gib=vm.disk_gib,
        start=timezone.now(),
        end=vm.end,
        formats=frozenset(v.format for v in variants),
        purpose=f"vm {vm_id}",
        exclude_hosts=frozenset(exclude),
        prefer_hosts=services.hosts_with(vm.image),
    )
    with transaction.atomic():  # the claim and its record on the VM commit together
        allocation = capacity.claim(demand, actor, owner=vm.owner)
        variant = _variant_for(vm, allocation.host)
        VM.objects.filter(pk=vm_id).update(allocation=allocation, host=allocation.host, variant=variant)
    services.set_state(vm_id, S.STAGING, actor, f"placed on {allocation.host.name}")
    return {"host": allocation.host_id, "allocation": allocation.pk, "variant": variant.pk}


def _variant_for(vm, host):
    """The image's variant for the host's hypervisor type (the simulator runs any format)."""
    variants = {v.hypervisor_type: v for v in vm.image.variants.all()}
    variant = variants.get(host.hypervisor_type)
    if variant is None and host.image_formats is None and variants:
        variant = variants.get("sim") or next(iter(variants.values()))
    if variant is None:
        raise Refused(f"image {vm.image.name} has no variant for {host.hypervisor_type} host {host.name}")
    return variant


def stage(vm_id, host_id, job_id, actor):
    """Get the VM's image variant onto the host (see ``stage_variant``)."""
    return stage_variant(host_id, _vm(vm_id).variant, job_id)


def stage_variant(host_id, variant, job_id):
    """Copy a variant onto a host, once per host, within the transfer limits (per host, per
    chassis, in all): a mass boot waits for a slot instead of flooding the network."""
    host = Hypervisor.objects.select_related("credential").get(pk=host_id)
    if services.cached(host, variant):  # the common case, read without a write transaction (SQLite's lock)
        return {"cached": True}
    deadline = time.monotonic() + STAGE_WAIT_SECONDS
    while True:
        turn = _take_stage_slot(host, variant, job_id)
        if turn == "staged":
            return {"cached": True}
        if turn == "mine":
            break
        if time.monotonic() > deadline:
            raise base.DriverError(
                f"no image transfer slot on {host.name} within {STAGE_WAIT_SECONDS} s", permanent=False
            )
        time.sleep(POLL_SECONDS)
    try:
        location = driver_for(host).stage_image(services.spec(variant))
    except Exception as exc:
        HostImage.objects.filter(host=host, variant=variant, staging_job=job_id).update(
            state=HostImage.State.FAILED, error=str(exc)[:2000], staging_job=None
        )
        raise
    HostImage.objects.filter(host=host, variant=variant).update(
        state=HostImage.State.STAGED, location=location[:1000], staged_at=timezone.now(), staging_job=None, error=""
    )
    return {"cached": False, "location": location}


def _take_stage_slot(host, variant, job_id):
    """'staged' (cached already), 'mine' (copy it now) or None (wait: busy, or being copied)."""
    now = timezone.now()
    fresh = now - timezone.timedelta(seconds=STAGE_STALE_SECONDS)
    with transaction.atomic():
        # One slot-taker at a time in all, so the chassis and global limits hold exactly; slots
        # are taken once per image and host, so this lock is rarely waited for.
        QueueSettings.lock()
        row, _ = HostImage.objects.get_or_create(host=host, variant=variant, defaults={"state": HostImage.State.FAILED})
        if row.state == HostImage.State.STAGED:
            return "staged"
        if row.state == HostImage.State.STAGING and row.staging_job != job_id and row.started and row.started > fresh:
            return None  # someone else is copying it: wait for their copy
        busy = HostImage.objects.filter(state=HostImage.State.STAGING, started__gt=fresh).exclude(pk=row.pk)
        if busy.filter(host=host).count() >= STAGE_PER_HOST:
            return None
        chassis = host.blade_center_id
        if chassis and busy.filter(host__blade_center_id=chassis).count() >= STAGE_PER_CHASSIS:
            return None  # the chassis' uplink is shared by all its blades
        if busy.count() >= STAGE_GLOBAL:
            return None
        HostImage.objects.filter(pk=row.pk).update(state=HostImage.State.STAGING, staging_job=job_id, started=now)
        return "mine"


def vm_spec(vm):
    return base.VMSpec(
        key=vm.key, vcpus=vm.vcpus, memory_mib=vm.memory_mib, disk_gib=vm.disk_gib, image=services.spec(vm.variant)
    )


def define(vm_id, actor):
    services.set_state(vm_id, S.DEFINING, actor, "defining on the host")
    vm = _vm(vm_id)
    info = driver_for(vm.host).create(vm_spec(vm))
    return {"key": info.key, "host": info.host}


def boot(vm_id, actor):
    services.set_state(vm_id, S.STARTING, actor, "booting")
    vm = _vm(vm_id)
    driver_for(vm.host).start(vm.key)


def wait_address(vm_id):
    vm = _vm(vm_id)
    driver = driver_for(vm.host)
    deadline = time.monotonic() + ADDRESS_TIMEOUT_SECONDS
    while True:
        address = driver.address(vm.key)
        if address:
            return address
        if time.monotonic() > deadline:
            raise base.DriverError(f"{vm.key} got no address within {ADDRESS_TIMEOUT_SECONDS} s", permanent=False)
        time.sleep(POLL_SECONDS)


def ready(vm_id, address, actor):
    services.set_state(vm_id, S.RUNNING, actor, "ready", address=address, error="")


def undo_create(vm_id, actor, reason):
    """Destroy whatever a failed create made on the host and release its claim."""
    vm = _vm(vm_id)
    error = reason
    if vm.host_id:
        try:
            driver_for(vm.host).destroy(vm.key)
        except Exception as exc:  # noqa: BLE001 (keep the claim: the VM may still use the host)
            error = f"{reason}; cleanup failed, run vm.destroy: {exc}"
            services.set_state(vm_id, S.FAILED, actor, "create failed", error=error[:4000])
            return
    if vm.allocation_id:
        capacity.release(vm.allocation, actor, f"{vm.key}: create failed")
    services.set_state(vm_id, S.FAILED, actor, "create failed", error=error[:4000], address=None)


# --- vm.destroy and power -------------------------------------------------------------------


@opcode("vm.destroy", params=VMParams, locks=vm_lock, staff_only=False)
def vm_destroy(job):
    """Destroy a VM on its host and release its claim."""
    vm = _vm(job.params["vm"])
    _authorise(job, vm)
    job.expect(2)
    job.step("destroy", destroy_on_host, vm.pk)
    job.step("release", release, vm.pk, job.actor)
    return {"vm": vm.pk}


def destroy_on_host(vm_id):
    vm = _vm(vm_id)
    if vm.host_id and vm.state != S.DESTROYED:
        driver_for(vm.host).destroy(vm.key)


def release(vm_id, actor):
    vm = _vm(vm_id)
    for allocation in (vm.allocation, vm.target_allocation):
        if allocation is not None:
            capacity.release(allocation, actor, f"{vm.key} destroyed")
    services.set_state(vm_id, S.DESTROYED, actor, "destroyed", address=None, target_allocation=None)


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
        vm = _vm(job.params["vm"])
        _authorise(job, vm)
        state = job.step(action, power, vm.pk, action, job.params.get("force", False), job.actor)
        return {"vm": vm.pk, "state": state}

    return run


def power(vm_id, action, force, actor):
    vm = _vm(vm_id)
    if vm.state not in (S.RUNNING, S.STOPPED, S.SUSPENDED):
        raise Refused(f"cannot {action} {vm.key}: it is {vm.state}")
    driver = driver_for(vm.host)
    if action == "stop":
        driver.stop(vm.key, force=force)
    else:
        getattr(driver, action)(vm.key)
    address = driver.address(vm.key) if POWER[action] == S.RUNNING else vm.address
    services.set_state(vm_id, POWER[action], actor, action, address=address)
    return POWER[action]


for _action in POWER:
    _power_opcode(_action)


@opcode("vm.snapshot", params=SnapshotParams, locks=vm_lock, staff_only=False)
def vm_snapshot(job):
    """Take a named snapshot of a VM."""
    vm = _vm(job.params["vm"])
    _authorise(job, vm)
    job.step("snapshot", snapshot, vm.pk, job.params["name"], job.actor)
    return {"vm": vm.pk, "snapshot": job.params["name"]}


def snapshot(vm_id, name, actor):
    vm = _vm(vm_id)
    driver_for(vm.host).snapshot(vm.key, name)
    snaps = [s for s in vm.snapshots if s.get("name") != name]
    services.set_state(
        vm_id,
        vm.state,
        actor,
        f"snapshot {name}",
        snapshots=[*snaps, {"name": name, "state": vm.state, "created": timezone.now().isoformat()}],
    )


@opcode("vm.revert", params=SnapshotParams, locks=vm_lock, staff_only=False)
def vm_revert(job):
    """Roll a VM back to a named snapshot."""
    vm = _vm(job.params["vm"])
    _authorise(job, vm)
    state = job.step("revert", revert, vm.pk, job.params["name"], job.actor)
    return {"vm": vm.pk, "state": state}


def revert(vm_id, name, actor):
    vm = _vm(vm_id)
    driver = driver_for(vm.host)
    driver.revert(vm.key, name)
    state = {base.VMState.RUNNING: S.RUNNING, base.VMState.SUSPENDED: S.SUSPENDED}.get(driver.state(vm.key), S.STOPPED)
    address = driver.address(vm.key) if state == S.RUNNING else vm.address
    services.set_state(vm_id, state, actor, f"reverted to {name}", address=address)
    return state


# --- vm.capture -----------------------------------------------------------------------------


@opcode("vm.capture", params=CaptureParams, locks=capture_locks, staff_only=False)
def vm_capture(job):
    """Capture a VM's disk as a new image (derived from the VM's image); the VM is stopped first.

    Every driver captures a stopped VM only, so a running VM is shut down (``force``: powered
    off) and left stopped. The new image inherits its parent's visibility and groups when
    staff (or the system) capture; a user's capture is restricted to staff until published,
    so a user's VM contents never become visible to others on their own.
    """
    vm = _vm(job.params["vm"])
    _authorise(job, vm)
    name = job.params["image_name"]
    if "capture" not in job._done and Image.objects.filter(name=name).exists():  # before stopping the VM
        raise Refused(f"an image named {name} exists already")
    job.expect(3)
    job.step("stop", power, vm.pk, "stop", job.params["force"], job.actor)
    captured = job.step("capture", capture_on_host, vm.pk, name)
    submitter = job.job.submitter
    inherit = submitter is None or submitter.is_staff
    image = job.step("register", register_capture, vm.pk, captured, inherit, job.actor)
    return {"vm": vm.pk, "image": image["image"], "variant": image["variant"], "name": name}


def capture_on_host(vm_id, name):
    vm = _vm(vm_id)
    return driver_for(vm.host).capture(vm.key, name).as_dict()


def register_capture(vm_id, captured, inherit, actor):
    """Record the captured image and its one variant (for the VM's host type) in the library."""
    vm = _vm(vm_id)
    parent = vm.image
    fields = {"hypervisor_type": vm.host.hypervisor_type}
    fields.update((name, captured[name]) for name in ("format", "location", "checksum", "size_gib"))
    existing = Image.objects.filter(name=captured["name"], parent=parent).first()
    if existing is not None:  # recorded by an interrupted attempt
        variant = existing.variants.filter(hypervisor_type=fields["hypervisor_type"]).first()
        variant = variant or services.add_variant(actor, existing, reason=f"captured from {vm.key}", **fields)
        return {"image": existing.pk, "variant": variant.pk}
    reason = f"captured from {vm.key}"
    with transaction.atomic():
        image = services.create_image(
            actor,
            name=captured["name"],
            os=parent.os,
            platform=parent.platform,
            description=f"Captured from {vm} ({vm.key}) of {parent.name}.",
            min_vcpus=parent.min_vcpus,
            min_memory_mib=parent.min_memory_mib,
            min_disk_gib=parent.min_disk_gib,
            default_vcpus=vm.vcpus,
            default_memory_mib=vm.memory_mib,
            default_disk_gib=max(vm.disk_gib, parent.min_disk_gib),
            visibility=parent.visibility if inherit else Image.Visibility.RESTRICTED,
            parent=parent,
            groups=list(parent.groups.all()) if inherit else [],
            reason=reason,
        )
        variant = services.add_variant(actor, image, reason=reason, **fields)
    return {"image": image.pk, "variant": variant.pk}


# --- vm.migrate and node.evacuate -----------------------------------------------------------


@opcode("vm.migrate", params=MigrateParams, locks=vm_lock, staff_only=True)
def vm_migrate(job):
    """Move a VM to another host (the target given, or the best other one)."""
    vm = _vm(job.params["vm"])
    if vm.state not in (S.RUNNING, S.STOPPED, S.SUSPENDED, S.MIGRATING):
        raise Refused(f"cannot migrate {vm.key}: it is {vm.state}")
    job.expect(4)
    try:
        plan = job.step("claim-target", claim_target, vm.pk, job.params.get("target"), job.actor)
        job.step("stage-target", stage, vm.pk, plan["target"], job.job_id, job.actor)
        job.step("migrate", move, vm.pk, plan["target"], job.actor)
    except Exception as exc:
        if _passes_through(exc):
            raise
        undo_migrate(vm.pk, job.actor, plan_state(job, vm), _fail_reason(exc))
        raise
    job.step("switch", switch, vm.pk, plan["state"], job.actor)
    return {"vm": vm.pk, "from": vm.host_id, "to": plan["target"]}


def plan_state(job, vm):
    recorded = job._done.get("claim-target")  # the VM's state before the move, if recorded
    return recorded["state"] if recorded else (vm.state if vm.state != S.MIGRATING else S.STOPPED)


def claim_target(vm_id, target_id, actor):
    vm = _vm(vm_id)
    if vm.target_allocation_id and vm.target_allocation.released is None:
        return {"target": vm.target_allocation.host_id, "allocation": vm.target_allocation_id, "state": vm.state}
    demand = capacity.Demand(
        vcpus=vm.vcpus,
        memory_mib=vm.memory_mib,
        disk_gib=vm.disk_gib,
        start=timezone.now(),
        end=vm.end,
        formats=frozenset([vm.variant.format]),
        purpose=f"vm {vm_id} (migration)",
    )
    with transaction.atomic():
        if target_id:
            target = Hypervisor.objects.filter(pk=target_id).first()
            if target is None:
                raise Refused(f"no hypervisor {target_id}")
            if target.state != Hypervisor.State.ONLINE:
                raise Refused(f"cannot migrate to {target.name}: it is {target.state}")
            allocation = capacity.claim_on_host(target, demand, actor, owner=vm.owner)
        else:
            allocation = capacity.claim(demand, actor, owner=vm.owner)
        if allocation.host_id == vm.host_id:
            raise Refused(f"{vm.key} is on {vm.host.name} already and no other host fits")  # rolls back the claim
        if allocation.host.driver != vm.host.driver:
            raise Refused(f"cannot migrate from a {vm.host.driver} host to a {allocation.host.driver} host")
        VM.objects.filter(pk=vm_id).update(target_allocation=allocation)
    return {"target": allocation.host_id, "allocation": allocation.pk, "state": vm.state}


def move(vm_id, target_id, actor):
    vm = _vm(vm_id)
    target = Hypervisor.objects.select_related("credential").get(pk=target_id)
    services.set_state(vm_id, S.MIGRATING, actor, f"migrating to {target.name}")
    driver_for(vm.host).migrate(vm.key, driver_for(target))


def switch(vm_id, state, actor):
    """Record the VM on the target and give the source's capacity back."""
    vm = _vm(vm_id)
    if vm.target_allocation_id is None:
        return  # switched already
    target = vm.target_allocation.host
    driver = driver_for(target)
    address = driver.address(vm.key) if state == S.RUNNING else vm.address
    old = vm.allocation
    with transaction.atomic():
        services.set_state(
            vm_id,
            state,
            actor,
            f"migrated to {target.name}",
            host=target,
            allocation=vm.target_allocation,
            target_allocation=None,
            address=address,
        )
        if old is not None:
            capacity.release(old, actor, f"{vm.key} migrated to {target.name}")


def undo_migrate(vm_id, actor, state, reason):
    vm = _vm(vm_id)
    if vm.target_allocation_id is None:
        services.set_state(vm_id, state, actor, "migration failed", error=reason[:4000])
        return
    target = vm.target_allocation.host
    try:
        arrived = driver_for(target).state(vm.key) != base.VMState.ABSENT
    except Exception:  # noqa: BLE001 (cannot tell: assume it stayed, keep the error)
        arrived = False
    if arrived:  # the move itself happened: finish it rather than lose track of the VM
        switch(vm_id, state, actor)
        return
    capacity.release(vm.target_allocation, actor, f"{vm.key}: migration failed")
    services.set_state(vm_id, state, actor, "migration failed", target_allocation=None, error=reason[:4000])


@opcode("node.evacuate", params=HostParams, staff_only=True)
def node_evacuate(job):
    """Drain a host and migrate every VM off it (one vm.migrate child job per VM)."""
    host_id = job.params["hypervisor"]
    job.step("drain", drain, host_id, job.actor)
    vm_ids = job.step(
        "list",
        lambda: list(
            VM.objects.filter(host_id=host_id, state__in=(S.RUNNING, S.STOPPED, S.SUSPENDED))
            .order_by("pk")
            .values_list("pk", flat=True)
        ),
    )
    children = [job.submit_child("vm.migrate", {"vm": vm_id}, key=f"vm-{vm_id}") for vm_id in vm_ids]
    return {"hypervisor": host_id, "vms": vm_ids, "jobs": children}


def drain(host_id, actor):
    host = Hypervisor.objects.get(pk=host_id)
    if host.state == Hypervisor.State.ONLINE:
        with transaction.atomic():
            inventory.set_state(host, Hypervisor.State.DRAINED, "evacuating", actor=actor)
    return host.state


# --- hypervisor.refresh ---------------------------------------------------------------------


@opcode("hypervisor.refresh", params=RefreshParams, locks=host_lock, staff_only=True)
def hypervisor_refresh(job):
    """Read a host's facts from its driver; an unreachable host is marked so in its facts.

    With ``drain_unreachable`` (the periodic refresh sets it) an unreachable online host is
    also drained, so placement stops choosing it, and put back online once it answers again —
    only if it was that refresh that drained it (``AUTO_DRAIN`` starts the state reason).
    """
    params = job.params
    return job.step("facts", refresh_facts, params["hypervisor"], job.actor, params.get("drain_unreachable", False))


AUTO_DRAIN = "unreachable, drained by the facts refresh"


def refresh_facts(host_id, actor, drain_unreachable=False):
    host = Hypervisor.objects.select_related("credential").get(pk=host_id)
    checked = timezone.now().isoformat()
    try:
        facts = {**driver_for(host).facts().as_dict(), "reachable": True, "checked": checked}
    except base.DriverError as exc:
        facts = {**host.facts, "reachable": False, "error": str(exc)[:1000], "checked": checked}
    inventory.report_facts(host, facts, actor=actor)
    if drain_unreachable:
        _follow_reachability(host, facts, actor)
    return {"reachable": facts["reachable"], "error": facts.get("error", ""), "state": host.state}


def _follow_reachability(host, facts, actor):
    if not facts["reachable"] and host.state == Hypervisor.State.ONLINE:
        inventory.set_state(host, Hypervisor.State.DRAINED, f"{AUTO_DRAIN}: {facts['error']}"[:500], actor=actor)
    elif facts["reachable"] and host.state == Hypervisor.State.DRAINED and host.state_reason.startswith(AUTO_DRAIN):
        inventory.set_state(host, Hypervisor.State.ONLINE, "reachable again (facts refresh)", actor=actor)


# --- image.stage / image.prestage ----------------------------------------------------------


class StageParams(serializers.Serializer):
    image = serializers.IntegerField(min_value=1)
    hypervisor = serializers.IntegerField(min_value=1)


class PrestageParams(serializers.Serializer):
    image = serializers.IntegerField(min_value=1)
    group = serializers.IntegerField(min_value=1, help_text="node group id")


@opcode("image.stage", params=StageParams, locks=host_lock, staff_only=True)
def image_stage(job):
    """Copy an image's variant for the host's type onto one host (within the transfer limits)."""
    image = Image.objects.get(pk=job.params["image"])
    host = Hypervisor.objects.get(pk=job.params["hypervisor"])
    probe = VM(image=image)
    variant = _variant_for(probe, host)
    return job.step("stage", stage_variant, host.pk, variant, job.job_id)


@opcode("image.prestage", params=PrestageParams, staff_only=True)
def image_prestage(job):
    """Stage an image onto every online host of a node group ahead of a known start (one
    ``image.stage`` child per host that can run it and lacks it)."""
    image = Image.objects.get(pk=job.params["image"])
    hosts = job.step("hosts", services.prestage_targets, image.pk, job.params["group"])
    children = [job.submit_child("image.stage", {"image": image.pk, "hypervisor": h}, key=f"host-{h}") for h in hosts]
    return {"image": image.pk, "hosts": hosts, "jobs": children}
