"""``run.execute``: one batch run from its VM's build to its destruction.

Steps (each idempotent; a retried job replays the recorded ones and goes on from the run's
row): ``vm`` (record the VM of the run's image and size), then ``vm.create``'s own steps
(claim, stage, define, start, address, ready: ``lifecycle.Attempt``, the same code), ``inputs``
(the input files and the script into the work directory), ``exec`` (start the command through
the guest command channel; idempotent by its tag ``run-<id>``), ``wait-<n>`` (read its output
from the run's place in it until it ends, its time limit passes or a cancel is asked; each step
at most ``RUN_STEP_SECONDS``, so no step nears the task timeout and a long run hands off
between steps), ``artifacts``, ``teardown`` (destroy the VM, release its claim), ``finish``.

Whatever the end — a failed build, a time limit, a cancel (the run's or its job's), an error
anywhere — the VM is destroyed and the claim released before the run ends (a teardown that
fails leaves the VM ``error`` holding its claim, as every failed destroy does, and says so).
A worker that dies mid-run leaves the job to be retried by the janitor: it continues where the
record stands (the command keeps running in the guest meanwhile).
"""

import time
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from rest_framework import serializers

from accounts import access
from capacity import preemption
from capacity import services as capacity
from drivers import base
from drivers import registry as drivers
from environments import placing
from environments import services as environment_services
from inventory.models import Hypervisor
from jobs import services as jobs
from jobs.registry import opcode
from jobs.runner import Canceled
from provisioning import private_networks
from provisioning import services as vms
from provisioning.models import VM
from provisioning.opcodes import capture as captures
from provisioning.opcodes import guest, lifecycle, migration, reuse
from provisioning.opcodes.common import fail_reason, load_vm, passes_through
from provisioning.opcodes.staging import stage
from runs import pooling, services, validation
from runs.models import Run, RunFile

S = Run.State
SCRIPT = "/tmp/vclmgr-run-script.sh"  # noqa: S108 (a path in the run's own throwaway guest)
MARKER = ".vclmgr-run"  # makes the work directory (a dot file: no artifact pattern's * matches it)
KILLED_FOR_TIME = "time limit"
SUSPEND = "suspend"  # a wait's end: asked to make room (``services.suspend_for``)
RESUME_ANSWER_SECONDS = 60  # a resumed guest's channel answers again within this
TRANSIENT_TRIES = 5  # temporary channel errors in a row one wait step rides out


class RunParams(serializers.Serializer):
    run = serializers.IntegerField(min_value=1)


class RunEnded(Exception):
    """The run ended before its command finished (time limit, cancel, failed build)."""

    def __init__(self, state, message, exit_status=None):
        super().__init__(message)
        self.state, self.message, self.exit_status = state, message, exit_status


class Unsound(RunEnded):
    """The run ended by a fault of its VM (not suspended, not resumed) or while it was suspended:
    its VM is destroyed, never pooled or kept."""


def tag(run_id):
    return f"run-{run_id}"


@opcode("run.execute", params=RunParams, locks=lambda p: [f"run:{p['run']}"], staff_only=True)
def run_execute(job):
    """Build a fresh VM, run the command in it, keep its output and files, destroy the VM
    (or, asked to make room, suspend the VM and end: ``run.resume`` goes on later)."""
    return _driven(job, _drive)


@opcode("run.resume", params=RunParams, locks=lambda p: [f"run:{p['run']}"], staff_only=True)
def run_resume(job):
    """Resume a suspended run's VM (its claim is back: ``services.resume_suspended``) and go on
    as ``run.execute`` does from its wait for the command: output, artifacts, teardown, finish."""
    return _driven(job, _resume_and_follow)


def _driven(job, drive):
    run_id = job.params["run"]
    run = Run.objects.get(pk=run_id)
    if run.is_final:
        return {"run": run_id, "state": run.state, "already": True}
    job.expect(12)
    try:
        outcome = drive(job, run)
    except Exception as exc:
        if passes_through(exc):
            raise
        state, message = (S.CANCELED, "canceled") if isinstance(exc, Canceled) else (S.ERROR, fail_reason(exc))
        if isinstance(exc, RunEnded):
            state, message = exc.state, exc.message
        # The run's own end (time limit, cancel) once its command ran: its VM is sound, it may pool.
        ran = Run.objects.filter(pk=run_id, started__isnull=False).exists()
        own_end = ran and isinstance(exc, (RunEnded, Canceled)) and not isinstance(exc, Unsound)
        own_end = own_end and run.environment_id is None  # an environment's machines go with it
        _teardown_now(run_id, message, job.actor, poolable=own_end, keepable=own_end and state == S.ERROR)
        services.finish(
            run_id,
            state,
            message,
            actor=job.actor,
            exit_status=getattr(exc, "exit_status", None),
            error="" if state == S.CANCELED else message,
        )
        if isinstance(exc, RunEnded):  # the run's own end: the job did its work
            return {"run": run_id, "state": state, "reason": message}
        raise
    return outcome


def _drive(job, run):
    actor, run_id = job.actor, run.pk
    made = job.db_step("vm", make_vm, run_id, actor=actor)
    # An int: the step recorded before pools (a job retried across the upgrade).
    vm_id, pooled = (made, False) if isinstance(made, int) else (made["vm"], made["pooled"])
    if isinstance(made, dict) and "machines" in made:  # an environment's: every machine, the entry last
        built = _build_machines(job, run, made)
        vm_id = built["vm"]
    else:
        built = _start_pooled(job, vm_id) if pooled else _build(job, vm_id, run.priority)
    if built.get("continued_by"):  # a standby host must be powered on first: not for runs (yet)
        raise RunEnded(S.ERROR, "its VM was placed on a host that is powered off; runs do not wait for a power-on")
    # From here each step's record rides on the run's next own write (``kept_records``): the
    # run's state change when its command starts, its output, its VM's teardown, its end. A
    # crash in between repeats the step, which is safe for each: the snapshot and the files are
    # taken or put again, the command is started once per tag, output is appended by offset.
    if not pooled:
        job.step_recorded_later("warm", pooling.warm_up, vm_id, actor=actor)
    job.step_recorded_later("inputs", put_inputs, run_id)
    job.step_recorded_later("exec", start, run_id, actor=actor)
    return _follow(job, run_id)


def _resume_and_follow(job, run):
    run_id = run.pk
    target = job.step("target", move_target, run_id)
    if target is not None and not _move(job, run_id, target):
        job.step("stay", stay_suspended, run_id, target, actor=job.actor)
        # ``refused_by``: its next move is not tried there (``services._move_one``).
        return {"run": run_id, "state": S.SUSPENDED, "refused_by": target}
    job.step("resume", resume, run_id, actor=job.actor)
    return _follow(job, run_id)


def move_target(run_id):
    """The host the suspended run's VM is to move to before it resumes (``services._move_one``), or None."""
    vm = load_vm(Run.objects.values_list("vm_id", flat=True).get(pk=run_id))
    held = vm.target_allocation
    return held.host_id if held is not None and held.released is None else None


def _move(job, run_id, target):
    """``vm.migrate``'s own steps, for the suspended VM (its saved memory goes with it); True
    when it is on ``target`` now. A move that fails and leaves the VM suspended where it was
    (its driver undoes what it did) is False: the run waits there for room. A VM the failure
    left in any other state ends the run (``Unsound``)."""
    vm_id = Run.objects.values_list("vm_id", flat=True).get(pk=run_id)
    vm = load_vm(vm_id)
    if vm.host_id != target and vm.target_allocation_id is None:
        return False  # an earlier attempt of this job failed to move it and undid the move
    try:
        job.step("stage-target", stage, vm_id, target, job.job_id)
        job.step("migrate", migration.move, vm_id, target, actor=job.actor)
    except Exception as exc:
        if passes_through(exc) or isinstance(exc, Canceled):
            raise
        migration.undo_migrate(vm_id, VM.State.SUSPENDED, fail_reason(exc), actor=job.actor)
        if load_vm(vm_id).host_id != target:  # (else it got there after all: undo_migrate switched)
            if _suspended_where_it_is(vm_id):
                return False
            why = fail_reason(exc)
            raise Unsound(S.ERROR, f"its suspended VM could not be moved to resume elsewhere: {why}") from exc
    job.step("switch", migration.switch, vm_id, VM.State.SUSPENDED, actor=job.actor)
    return True


def _suspended_where_it_is(vm_id):
    vm = load_vm(vm_id)
    if vm.state != VM.State.SUSPENDED:
        return False
    try:
        return drivers.driver_for(vm.host).state(vm.key) == base.VMState.SUSPENDED
    except base.DriverError:
        return False


def stay_suspended(run_id, target_id, *, actor):
    """The run's VM could not be moved to ``target_id``, and is suspended where it was: the run
    stays suspended, its trail says why (the VM's error, from ``undo_migrate``)."""
    vm = load_vm(Run.objects.values_list("vm_id", flat=True).get(pk=run_id))
    target = Hypervisor.objects.values_list("name", flat=True).get(pk=target_id)
    services.set_state(
        run_id,
        S.SUSPENDED,
        f"its VM could not be moved to {target} ({vm.error or 'failed'}); "
        f"still suspended on {vm.host.name}, it resumes when room returns",
        actor=actor,
    )


def _follow(job, run_id):
    """From the running command to the run's end, or to its suspension (the job ends then)."""
    actor = job.actor
    n = 0
    while True:
        state = job.step_recorded_later(f"wait-{n}", wait, run_id)
        n += 1
        job.expect(max(12, n + 8))
        if state["end"]:
            break
    if state["end"] == SUSPEND:
        job.step("suspend", suspend, run_id, actor=actor)
        return {"run": run_id, "state": S.SUSPENDED}
    if state["end"] == "cancel":
        raise RunEnded(S.CANCELED, "canceled while running")
    if state["end"] == KILLED_FOR_TIME:
        limit = Run.objects.get(pk=run_id).time_limit
        raise RunEnded(S.ERROR, f"killed: past its time limit of {limit} s (its VM destroyed)")
    job.step_recorded_later("artifacts", collect, run_id, actor=actor)
    code = state["exit_status"]
    # A failed build's VM may be kept stopped for inspection (never pooled, destroyed later).
    kept = code != 0 and job.step("keep", keep_failed, run_id, actor=actor)
    if not kept and not keep_in_pool(_pool_steps(job), run_id, actor=actor, log=job.log):
        job.step_recorded_later("teardown", teardown, run_id, actor=actor)
    final = S.SUCCESS if code == 0 else S.ERROR
    message = f"exited with status {code}"
    outcome = {"run": run_id, "state": final, "exit_status": code}
    # The run's end and the job's in one transaction.
    job.last_db_step("finish", end, run_id, final, message, actor=actor, exit_status=code, job_result=outcome)
    return outcome


def end(run_id, state, message, *, actor, exit_status):
    services.finish(
        run_id,
        state,
        message,
        actor=actor,
        exit_status=exit_status,
        error="" if state in (S.SUCCESS, S.CANCELED) else message,
    )


def _build(job, vm_id, priority, suffix=""):
    # Its class's rank: a run of a higher class may suspend lower-class runs to fit.
    attempt = lifecycle.Attempt(job, vm_id, suffix=suffix, rank=preemption.rank(priority))
    try:
        return attempt.run()
    except Exception as exc:
        if passes_through(exc) or isinstance(exc, Canceled):
            raise
        why = f"no capacity: {exc}" if isinstance(exc, capacity.NoCapacity) else fail_reason(exc)
        raise RunEnded(S.ERROR, f"its VM could not be built ({attempt.at} failed): {why}") from exc


RETRY = "-retry"  # the steps of an environment's machines built again elsewhere


def _build_machines(job, run, made):
    """Build an environment's machines (the entry one last). One that fails is built again on
    another host with the machines its networks join it to, once, as a reservation's is
    (``retry_machines``: ``placing.claim_again``, the one verb for both); when no host has
    room for them all, or the retry fails too, the run ends with the reason (its teardown
    leaves nothing on any host)."""
    retried = job._done.get("retry-machines")  # (a replay after the retry began goes on with its machines)
    if retried is None:
        try:
            return _build_each(job, run, made, "")
        except RunEnded as exc:
            # The old machines go before the run points at new ones: until then the run's
            # teardown (however the job ends: a cancel, its time limit, a host that does not
            # answer) is what removes them; after, nothing refers to them any more.
            old = [vm.pk for vm in _group(run.pk, exc.vm_id)[2].values()]
            job.step("retry-teardown", _teardown_vms, old, exc.message, actor=job.actor)
            retried = job.db_step("retry-machines", retry_machines, run.pk, exc.vm_id, exc.message, actor=job.actor)
    if "retry-teardown" not in job._done:  # (a retry begun before the teardown came first)
        job.step("retry-teardown", _teardown_vms, retried["replaced"], "", actor=job.actor)
    try:
        return _build_each(job, run, retried, RETRY)
    except RunEnded as exc:
        raise RunEnded(exc.state, f"{exc.message} (built again on another host once already)") from exc


def _build_each(job, run, made, suffix):
    """Build ``made``'s machines not running yet, the entry one last; a ``RunEnded`` says which
    one failed (``vm_id``)."""
    todo = [(m["vm"], f"-{m['hostname']}{suffix}") for m in made["machines"]] + [(made["vm"], suffix)]
    built = None
    for vm_id, steps in todo:
        if vm_id != made["vm"] and load_vm(vm_id).state == VM.State.RUNNING:
            continue  # (built before another failed, and not built again with it)
        try:
            built = _build(job, vm_id, run.priority, suffix=steps)
        except RunEnded as exc:
            exc.vm_id = vm_id
            raise
    return built


def retry_machines(run_id, failed_vm_id, why, *, actor):
    """The machine ``failed_vm_id`` of an environment run and those its networks join it to:
    new VMs, claimed again as one gang off the host it failed on with their networks recorded
    again there (``placing.claim_again``); the run points at them. In the step's transaction.
    ``{"vm": entry id, "machines": [...], "replaced": [old VM ids]}``, or ``RunEnded`` when no
    host has room for them all (nothing of it is kept)."""
    run, names, group, networks = _group(run_id, failed_vm_id)
    failed = load_vm(failed_vm_id)
    key = f"run{run_id}"
    old_host = failed.host or failed.allocation.host
    fresh = {name: _vm_again(vm) for name, vm in group.items()}
    try:
        with transaction.atomic():
            claims = placing.claim_again(
                group,
                networks,
                [old_host.pk],
                2,  # its second build
                start=timezone.now(),
                purposes={name: f"vm {vm.pk}" for name, vm in fresh.items()},
                actor=actor,
                owner=run.owner,
                gang_id=f"environment run {run_id}",
                old_claims=placing.claims_to_give_back(group.values()),
            )
    except placing.Refused as exc:
        raise RunEnded(S.ERROR, f"{why}; no other host for a retry: {exc.words}") from None
    for name, vm in fresh.items():
        VM.objects.filter(pk=vm.pk).update(allocation=claims[name])
        vm.networks.set(private_networks.of_machine(key, name, claims[name].host_id))
    entry = fresh.get(run.vm.hostname, run.vm)
    others = [fresh.get(vm.hostname, vm) for vm in run.machines.all()]
    Run.objects.filter(pk=run_id).update(vm=entry)
    run.machines.set(others)
    where = " and ".join(sorted({claim.host.name for claim in claims.values()}))
    words = f"{', '.join(sorted(names))} on {where} after {failed.hostname} failed on {old_host.name}: {why}"
    services.set_state(run_id, S.WAITING, f"retrying on another host: {words}", actor=actor)
    return {
        "vm": entry.pk,
        "machines": [{"vm": vm.pk, "hostname": vm.hostname} for vm in others],
        "replaced": sorted(vm.pk for vm in group.values()),
    }


def _group(run_id, failed_vm_id):
    """``(run, names, {hostname: VM}, networks)``: the run's machine ``failed_vm_id`` and those
    its networks join it to, as the run has them now."""
    run = Run.objects.select_related("vm").get(pk=run_id)
    names, networks = private_networks.group_of(f"run{run_id}", load_vm(failed_vm_id).hostname)
    current = {vm.hostname: vm for vm in [run.vm, *run.machines.all()]}
    return run, names, {name: current[name] for name in names}, networks


def _vm_again(old):
    """A new VM row for the machine ``old`` was (its claim and networks are given it once placed)."""
    return _machine_vm(old.name, old.image, old.revision_id, old.owner, old.hostname, old.end, old.resources)


def _machine_vm(name, image, revision_id, owner, hostname, end, size):
    """An environment run's machine: ``adhoc=False``, the run counts it."""
    return VM.objects.create(
        name=name,
        image=image,
        revision_id=revision_id,
        owner=owner,
        adhoc=False,
        hostname=hostname,
        end=end,
        **size,
    )


def _teardown_vms(vm_ids, why, *, actor):
    """The machines to be built again elsewhere, gone from their host (idempotent). One whose
    destroy fails (its host failed it, or does not answer) is left as the rest of the code
    leaves it: ``lost`` with its claims released when its host is offline (verify shows it if
    the host returns), else ``error`` with its claims held and a ``vm.destroy`` queued, whose
    success gives them back. The retry goes on either way."""
    for vm_id in vm_ids:
        try:
            lifecycle.destroy_on_host(vm_id)
        except Exception as exc:  # noqa: BLE001
            if passes_through(exc) or isinstance(exc, Canceled):
                raise
            vm = load_vm(vm_id)
            reason = f"{why}; destroying it before its retry failed: {fail_reason(exc)}"[:500]
            if vm.host is not None and vm.host.state == Hypervisor.State.OFFLINE:
                vms.mark_lost(vm_id, reason, actor=actor)
            else:
                vms.cleanup_failed(vm_id, reason, actor=actor)
                jobs.submit("vm.destroy", {"vm": vm_id}, actor=actor, submitter=vm.owner, reason=reason)
            continue
        lifecycle.release(vm_id, actor=actor)


def _start_pooled(job, vm_id):
    """A pooled VM (taken with its claim by ``make_vm``): back to its warm snapshot, running
    without a boot; or, with none (its first run could not take one), ``vm.reuse``'s steps: a
    fresh seed and a boot of the disk reverted to its clean snapshot (see ``pooling``)."""
    warm = job.step("warm-start", _has_warm_snapshot, vm_id)
    try:
        if warm:
            address = reuse.resume_warm(job.step, vm_id, actor=job.actor)
        else:
            address = reuse.bring_up(job.step, vm_id, actor=job.actor)
    except Exception as exc:
        if passes_through(exc) or isinstance(exc, Canceled):
            raise
        raise RunEnded(S.ERROR, f"its pooled VM could not be started: {fail_reason(exc)}") from exc
    return {"vm": vm_id, "address": address, "pooled": True}


def _has_warm_snapshot(vm_id):
    return vms.has_warm_snapshot(load_vm(vm_id))


def make_vm(run_id, *, actor):
    """The run's VM (chosen once, in the step's own transaction): a pooled one of its image and
    size where the run fits (taken with a claim on its host), else a new row to build, its
    claim's end the run's latest end. ``adhoc=False``: the run is what counts against the
    owner's quotas, not its VM. ``{"vm": id, "pooled": bool}``."""
    run = Run.objects.select_related("image", "owner").get(pk=run_id)
    if run.cancel_requested:
        raise RunEnded(S.CANCELED, "canceled before its VM was built")
    if run.vm_id:
        return {"vm": run.vm_id, "pooled": False}
    end = timezone.now() + (run.hold_until - run.created)
    if run.environment_id:
        return _make_machines(run, end, actor=actor)
    vm = pooling.take(run, end, actor=actor)
    if vm is not None:
        Run.objects.filter(pk=run_id).update(vm=vm)
        how = "its warm snapshot: no boot" if vms.has_warm_snapshot(vm) else "its clean snapshot, a fresh seed"
        services.set_state(
            run_id, S.WAITING, f"started on a pooled VM {vm.key} on {vm.host.name} (reverted to {how})", actor=actor
        )
        return {"vm": vm.pk, "pooled": True}
    vm = VM.objects.create(
        name=f"run-{run_id}",
        image=run.image,
        owner=run.owner,
        adhoc=False,
        vcpus=run.vcpus,
        memory_mib=run.memory_mib,
        disk_gib=run.disk_gib,
        end=end,
    )
    Run.objects.filter(pk=run_id).update(vm=vm)
    services.set_state(run_id, S.WAITING, f"building its VM {vm.key} ({run.image.name})", actor=actor)
    return {"vm": vm.pk, "pooled": False}


def _make_machines(run, end, *, actor):
    """An environment run's VMs, one per machine, each on its claim of one gang decision (their
    builds adopt them), with their hostnames and networks; the entry machine's is the run's.
    ``{"vm": entry id, "pooled": False, "machines": [{"vm": id, "hostname": name}, ...]}``."""
    template = run.environment
    machines = environment_services.expand(template)
    if run.counted_machines and environment_services.counted(machines) != run.counted_machines:
        # its quotas counted the machines then: building others would go around them
        words = f"environment {template.name} has other machines than when it was submitted (its quotas counted those)"
        raise RunEnded(S.ERROR, f"{words}: submit it again")
    made = {}
    for machine in machines:
        made[machine.hostname] = _machine_vm(
            f"run-{run.pk}-{machine.hostname}",
            machine.image,
            machine.revision.pk if machine.revision is not None else None,
            run.owner,
            machine.hostname,
            end,
            machine.size,
        )
    purposes = {hostname: f"vm {vm.pk}" for hostname, vm in made.items()}
    try:
        claims = placing.claim(template, machines, timezone.now(), end, purposes=purposes, actor=actor, owner=run.owner)
        placing.record_networks(f"run{run.pk}", template, machines, claims)
    except placing.Refused as exc:
        raise RunEnded(S.ERROR, f"its machines could not be placed: {exc.words}") from None
    for hostname, vm in made.items():
        VM.objects.filter(pk=vm.pk).update(allocation=claims[hostname])
        vm.networks.set(private_networks.of_machine(f"run{run.pk}", hostname, claims[hostname].host_id))
    entry = made[next(m.hostname for m in machines if m.entry)]
    others = [vm for vm in made.values() if vm.pk != entry.pk]
    Run.objects.filter(pk=run.pk).update(vm=entry)
    run.machines.set(others)
    where = claims[entry.hostname].host_name
    services.set_state(run.pk, S.WAITING, f"building its {len(made)} machines on {where}", actor=actor)
    return {"vm": entry.pk, "pooled": False, "machines": [{"vm": vm.pk, "hostname": vm.hostname} for vm in others]}


def _channel(run):
    """The run VM's driver with its image's guest login (VMware guest operations need one)."""
    vm = load_vm(run.vm_id)
    return guest.channel_driver(vm), vm.key


def put_inputs(run_id):
    run = Run.objects.get(pk=run_id)
    driver, key = _channel(run)
    workdir = settings.RUN_WORKDIR
    driver.guest_put_file(key, f"{workdir}/{MARKER}", str(run_id).encode())
    for item in run.files.filter(kind=RunFile.Kind.INPUT):
        with services.storage().open(item.stored, "rb") as handle:
            driver.guest_put_file(key, f"{workdir}/{item.path}", handle.read())
    if run.script:
        driver.guest_put_file(key, SCRIPT, run.script.encode())


def start(run_id, *, actor):
    run = Run.objects.get(pk=run_id)
    if run.cancel_requested:
        raise RunEnded(S.CANCELED, "canceled before its command started")
    driver, key = _channel(run)
    argv = ["/bin/sh", SCRIPT] if run.script else run.argv
    driver.guest_exec(key, tag(run_id), argv, run.env, settings.RUN_WORKDIR)
    vm = load_vm(run.vm_id)
    services.set_state(run_id, S.RUNNING, f"running on {vm.host.name}", actor=actor, started=timezone.now())


def wait(run_id):
    """Read output until the command ends, the time limit passes, a cancel is asked, or this
    step's share of time is up; ``{"end": None | "exited" | "time limit" | "cancel", ...}``."""
    run = Run.objects.get(pk=run_id)
    driver, key = _channel(run)
    step_end = time.monotonic() + settings.RUN_STEP_SECONDS
    deadline = run.started.timestamp() + run.time_limit + run.suspended_seconds  # suspended time is not its
    offset = run.output_seen
    blips = 0
    while True:
        try:
            status = driver.guest_exec_status(key, tag(run_id), offset)
        except base.DriverError as exc:  # a blip of the channel must not end a long run: ask again
            blips += 1
            if exc.permanent or blips > TRANSIENT_TRIES:
                raise
            time.sleep(settings.RUN_POLL_SECONDS)
            continue
        if status.output:
            offset = services.append_output(run_id, offset, status.output)
        if status.exited:
            return {"end": "exited", "exit_status": status.exit_status}
        if time.time() >= deadline:
            return {"end": KILLED_FOR_TIME}
        asked = Run.objects.filter(pk=run_id).values_list("cancel_requested", "suspend_requested").get()
        if asked[0]:
            return {"end": "cancel"}
        if asked[1]:
            return {"end": SUSPEND}
        if time.monotonic() >= step_end:
            return {"end": None}
        if not status.output:
            time.sleep(min(settings.RUN_POLL_SECONDS, max(0.0, deadline - time.time())))


def suspend(run_id, *, actor):
    """Suspend the run's VM to disk (its claim is its disk's alone already: ``services.suspend_for``);
    idempotent. A VM that cannot be suspended ends the run (the handler destroys it)."""
    run = Run.objects.get(pk=run_id)
    vm = load_vm(run.vm_id)
    try:
        drivers.driver_for(vm.host).suspend(vm.key)
    except base.DriverError as exc:
        raise Unsound(S.ERROR, f"its VM could not be suspended to make room: {exc}") from exc
    vms.set_state(vm.pk, VM.State.SUSPENDED, "suspended to disk to make room", actor=actor)
    services.suspended(run_id, actor=actor)


def resume(run_id, *, actor):
    """Resume the run's VM on its host (idempotent: a replay finds it running)."""
    run = Run.objects.get(pk=run_id)
    if run.cancel_requested:
        raise Unsound(S.CANCELED, "canceled while suspended")
    if run.state != S.SUSPENDED:
        return
    vm = load_vm(run.vm_id)
    driver = drivers.driver_for(vm.host)
    try:
        driver.resume(vm.key)
    except base.DriverError as exc:
        raise Unsound(S.ERROR, f"its suspended VM could not be resumed on {vm.host.name}: {exc}") from exc
    if driver.boots_guests:
        _answering(driver, vm.key)
    vms.set_state(vm.pk, VM.State.RUNNING, "resumed", actor=actor, error="")  # (a failed move's error)
    services.resumed(run_id, actor=actor)


def _answering(driver, key):
    """After a restore the guest's channel may take a moment to answer again: wait for it."""
    deadline = time.monotonic() + RESUME_ANSWER_SECONDS
    while True:
        try:
            if driver.agent_answers(key):
                return
        except base.Invalid:
            return  # no agent to ask (the wait's own retries ride out a slow channel)
        if time.monotonic() > deadline:
            raise Unsound(S.ERROR, f"its guest did not answer within {RESUME_ANSWER_SECONDS} s of its resume")
        time.sleep(max(settings.RUN_POLL_SECONDS, 0.1))


def collect(run_id, *, actor):
    run = Run.objects.get(pk=run_id)
    if not run.artifacts:
        return []
    driver, key = _channel(run)
    workdir = settings.RUN_WORKDIR
    found = driver.guest_glob(key, workdir, run.artifacts)
    # The guest lists what it likes: names we will not store are skipped, and only the first
    # RUN_ARTIFACT_MAX_FILES are fetched; the trail says so in one line each, not one per name.
    kept, bad, over = [], [], 0
    for path in found:
        try:
            validation.artifact_path(path)
        except ValidationError:
            bad.append(path)
            continue
        if len(kept) >= settings.RUN_ARTIFACT_MAX_FILES:
            over += 1
            continue
        data = driver.guest_get_file(key, f"{workdir}/{path}", settings.RUN_ARTIFACT_MAX_BYTES)
        services.store_artifact(run_id, path, data)
        kept.append(path)
    if bad:
        names = ", ".join(repr(path[:100]) for path in bad[:3]) + (", …" if len(bad) > 3 else "")
        services.set_state(run_id, run.state, f"{len(bad)} artifacts skipped, not plain paths: {names}", actor=actor)
    if over:
        limit = settings.RUN_ARTIFACT_MAX_FILES
        message = f"{over} artifacts past the first {limit} not kept (RUN_ARTIFACT_MAX_FILES)"
        services.set_state(run_id, run.state, message, actor=actor)
    return kept


def teardown(run_id, *, actor):
    """Destroy the run's VM (an environment's: every machine) on its host and release its
    claim (idempotent)."""
    run = Run.objects.get(pk=run_id)
    others = list(run.machines.values_list("pk", flat=True))
    for vm_id in [*others, *([run.vm_id] if run.vm_id else [])]:
        lifecycle.destroy_on_host(vm_id)
        lifecycle.release(vm_id, actor=actor)
    if run.environment_id:  # (those whose machines never got to a host)
        private_networks.forget(f"run{run_id}")


def _pool_steps(job):
    # Kept records (see ``_drive``): the check reads, the rollback reverts to the clean
    # snapshot again, parking is idempotent.
    return lambda name, fn, *args, **kwargs: job.step_recorded_later(f"pool-{name}", fn, *args, **kwargs)


def _now(name, fn, *args, **kwargs):
    return fn(*args, **kwargs)


def keep_in_pool(step, run_id, *, actor, log):
    """Roll the run's VM back to its clean snapshot and park it in its image's pool, if the
    image pools and the pool on its host has room; True when it was kept (no teardown then).
    A rollback that fails leaves the VM to the teardown, which destroys it."""
    vm_id = Run.objects.values_list("vm_id", flat=True).get(pk=run_id)
    if vm_id is None or not step("check", _pool_room, vm_id):
        return False
    try:
        reuse.roll_back(step, vm_id, actor=actor)
    except Exception as exc:
        if passes_through(exc) or isinstance(exc, Canceled):
            raise
        log(f"rolling {load_vm(vm_id).key} back for the pool failed ({fail_reason(exc)}); destroying it", "warning")
        return False
    kept = step("park", vms.park_in_pool, vm_id, f"pooled after run {run_id}", actor=actor)
    if kept:
        services.set_state(
            run_id,
            Run.objects.get(pk=run_id).state,
            f"its VM {load_vm(vm_id).key} reverted to its clean snapshot and kept in the pool",
            actor=actor,
        )
    return kept


def _pool_room(vm_id):
    return vms.pool_room(load_vm(vm_id))


def _teardown_now(run_id, message, actor, poolable=False, keepable=False):
    """The teardown outside a step (the job is ending anyway); a failure keeps the VM ``error``
    with its claim, and the run's error says so. ``poolable``: the run ended by its own rule
    (time limit, cancel) after its command started, so its VM may be rolled back into the pool;
    never after a failed build or a fault of the VM, its guest or its host. ``keepable``: that
    end is an error (its time limit), so its VM may be kept for inspection instead."""
    try:
        if keepable and keep_failed(run_id, actor=actor):
            return
        if poolable and keep_in_pool(_now, run_id, actor=actor, log=lambda *a: None):
            return
        teardown(run_id, actor=actor)
    except Exception as exc:  # noqa: BLE001
        vm_id = Run.objects.get(pk=run_id).vm_id
        vms.cleanup_failed(vm_id, f"{message}; destroying it failed, run vm.destroy: {exc}", actor=actor)
        services.set_state(run_id, S.ERROR, f"its VM could not be destroyed: {exc}", actor=actor)


@opcode("run.cleanup", params=RunParams, locks=lambda p: [f"run:{p['run']}"], staff_only=True)
def run_cleanup(job):
    """After a run's job ended without ending the run (its worker lost on every attempt): destroy
    its VM, release the claim, end the run as an error with the job's reason."""
    run_id = job.params["run"]
    run = Run.objects.select_related("vm__host").get(pk=run_id)
    state, message = _cleanup_end(run)
    if run.state == S.SUSPENDED:  # its host may be gone: a failed destroy keeps the VM ``error``, the run ends
        job.step("teardown", _teardown_now, run_id, message, job.actor)
    else:
        job.step("teardown", teardown, run_id, actor=job.actor)
    if not Run.objects.get(pk=run_id).is_final:
        job.step("finish", end, run_id, state, message, actor=job.actor, exit_status=None)
    return {"run": run_id}


def _cleanup_end(run):
    """How a run that ``run.cleanup`` ends ends: ``(state, message)``."""
    if run.state == S.SUSPENDED and run.cancel_requested:
        return S.CANCELED, "canceled while suspended; its VM destroyed"
    if run.state == S.SUSPENDED and run.vm is not None and run.vm.host.state == run.vm.host.State.OFFLINE:
        return S.ERROR, f"its host {run.vm.host.name} went offline while it was suspended; its VM destroyed"
    from jobs.models import Job

    ended = Job.objects.filter(pk=run.job).values_list("error_message", flat=True).first() or "it ended"
    return S.ERROR, f"its job ended before the run did ({ended[:500]}); its VM destroyed"


# --- a failed run's VM kept for inspection (post-build analysis, after ETICS) ------------------


def keep_failed(run_id, *, actor):
    """Keep a failed run's VM (a non-zero exit, or its time limit: the run's own failure, never a
    fault of the VM, its guest or its host, which the callers never pass here) powered off on a
    disk-only claim for ``keep_failed_minutes``, if the run asks; True when kept (idempotent).
    ``run.discard`` (the housekeeping's, or the owner's) captures it if asked and destroys it."""
    run = Run.objects.get(pk=run_id)
    if run.vm_id is None or not (run.keep_failed_minutes or run.capture_failed):
        return False
    vm = load_vm(run.vm_id)
    if vm.state not in (VM.State.RUNNING, VM.State.STOPPED, VM.State.SUSPENDED) or vm.error:
        return False
    driver = drivers.driver_for(vm.host)
    if driver.state(vm.key) != base.VMState.STOPPED:
        driver.stop(vm.key, force=True)  # the command is over: nothing running in it is kept
    until = timezone.now() + timedelta(minutes=run.keep_failed_minutes)
    vms.keep_stopped(vm.pk, f"kept stopped for inspection after run {run_id} failed", actor=actor)
    what = "captured and destroyed" if run.capture_failed else "destroyed"
    services.kept(
        run_id,
        until,
        f"its VM {vm.key} kept stopped for inspection until {until:%Y-%m-%d %H:%M} UTC, then {what}",
        actor=actor,
    )
    return True


@opcode("run.discard", params=RunParams, locks=lambda p: [f"run:{p['run']}"], staff_only=True)
def run_discard(job):
    """A failed run's kept VM: captured as an image of the run's owner (if the run asked; a
    failed capture is in the trail and does not keep the VM), then destroyed, its claim released."""
    run_id = job.params["run"]
    run = Run.objects.select_related("vm").get(pk=run_id)
    if services.kept_vm(run) is None:
        return {"run": run_id, "already": True}
    job.expect(4)
    if run.capture_failed and run.captured_image_id is None:
        try:
            _capture(job, run)
        except Exception as exc:
            if passes_through(exc) or isinstance(exc, Canceled):
                raise
            services.set_state(
                run_id,
                run.state,
                f"capturing its VM failed: {fail_reason(exc)}; destroying it",
                actor=job.actor,
                unless_final=False,
            )
    job.step("teardown", teardown, run_id, actor=job.actor)
    services.set_state(run_id, run.state, f"its kept VM {run.vm.key} destroyed", actor=job.actor, unless_final=False)
    return {"run": run_id, "vm": run.vm_id, "image": Run.objects.get(pk=run_id).captured_image_id}


def _capture(job, run):
    name = f"{run.image.name}-run-{run.pk}"[:100]
    captured = job.step("capture", captures.capture_on_host, run.vm_id, name)
    # The owner's image, as when they capture a VM themselves: restricted, to their groups only.
    visibility, groups = access.capture_access(run.owner, run.image)
    image = job.step("register", captures.register_capture, run.vm_id, captured, visibility, groups, actor=job.actor)
    job.step("captured", _captured, run.pk, image["image"], name, actor=job.actor)


def _captured(run_id, image_id, name, *, actor):
    Run.objects.filter(pk=run_id).update(captured_image=image_id)
    services.set_state(
        run_id,
        Run.objects.get(pk=run_id).state,
        f"its VM captured as the image {name}",
        actor=actor,
        unless_final=False,
    )
