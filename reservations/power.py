"""An environment suspended, resumed or reverted as one: ``suspend``, ``resume``, ``revert``.

The verbs are asked of the head (a machine alone refuses them, naming its head, as it refuses
end and extend) and checked against every machine before anything is done: the environment is
ready, every machine's VM is in a state the verb starts from, and, for ``revert``, every
machine keeps the clean snapshot its image takes before the first boot (an image without
``revert_on_end`` keeps none: the revert is refused, naming those machines). Then one job
(``reservation.<verb>``, locking the head and every machine's VM) acts on the machines one
after another, each in a step whose outcome (done, or why not) is recorded, so a retried job
replays the same story.

All or none: when one machine fails, those already done are put back (resumed again after a
failed suspend, suspended again after a failed resume; after a failed revert every machine is
started again, since a reverted disk cannot be un-reverted), and the job fails saying which
machine failed and why, and what was put back. The head's history says the same, so its page
tells it live.

Claims: a suspended environment keeps every claim whole, as a VM its user suspends does (its
CPU and memory stay reserved until its end, and its hours count): only a VM suspended to make
room for work of a higher class gives them back (``provisioning.services.suspend_claim``), and
its user may not resume it. So nothing here changes a claim, and a resume never waits for room.
"""

from django.db import transaction
from rest_framework import serializers

from core import changelog
from core.changelog import Actor
from core.errors import Conflict
from drivers import base
from drivers import registry as drivers
from jobs import services as jobs
from provisioning import services as vms
from provisioning.models import VM
from provisioning.opcodes import lifecycle
from provisioning.opcodes.common import Refused, fail_reason, load_vm, passes_through
from reservations import environments, status
from reservations.models import Reservation

#: verb -> the VM states it starts from (one already at its end is left as it is), its end, its past
VERBS = {
    "suspend": ((VM.State.RUNNING, VM.State.SUSPENDED), VM.State.SUSPENDED, "suspended"),
    "resume": ((VM.State.SUSPENDED, VM.State.RUNNING), VM.State.RUNNING, "resumed"),
    "revert": ((VM.State.RUNNING, VM.State.SUSPENDED, VM.State.STOPPED), VM.State.RUNNING, "reverted"),
}
#: what puts a machine back after the verb failed on another one, and its past
UNDO = {"suspend": ("resume", "resumed"), "resume": ("suspend", "suspended"), "revert": ("start", "started")}


def suspend(reservation, reason="suspended by the user", *, actor):
    """Suspend every machine of the environment ``reservation`` heads; returns the job."""
    return _submit(reservation, "suspend", reason, actor=actor)


def resume(reservation, reason="resumed by the user", *, actor):
    """Resume every machine of the environment ``reservation`` heads; returns the job."""
    return _submit(reservation, "resume", reason, actor=actor)


def revert(reservation, reason="reverted by the user", *, actor):
    """Revert every machine of the environment ``reservation`` heads to its clean snapshot and
    start it again (as on its first boot: nothing of what was done in it is kept); the job."""
    return _submit(reservation, "revert", reason, actor=actor)


def _submit(reservation, verb, reason, *, actor):
    actor = Actor.of(actor)
    machines = _check(reservation, verb)
    with transaction.atomic():
        job = jobs.submit(
            f"reservation.{verb}",
            {"reservation": reservation.pk, "vms": [m.vm_id for m in machines]},
            actor=actor,
            submitter=reservation.user,
            reason=f"environment reservation {reservation.pk}: {reason}",
        )
        changelog.record(reservation, "update", actor, reason=f"{verb}: {reason}")
        told = machine_states(machines[0])
        status.history(machines[0], f"{reason}: its {len(machines)} machines, by job {job.pk}", machines=told)
    return job


def _check(reservation, verb):
    """The machines ``verb`` acts on, the head first; ``Conflict`` saying why not."""
    environments.check_acting_on(reservation)
    if reservation.environment_id is None:
        raise Conflict(
            f"reservation {reservation.pk} is no environment: {verb} its VM itself (the VM's page or /api/v1/vms/)"
        )
    head = Reservation.objects.select_related("vm", "image").get(pk=reservation.pk)  # as it is now
    if head.status != Reservation.Status.READY:
        past = VERBS[verb][2]
        raise Conflict(f"environment reservation {head.pk} is {head.status}: only a ready one is {past}")
    machines = environments.machines_of(head)
    why = refusal(machines, verb)
    if why:
        raise Conflict(f"cannot {verb} environment reservation {reservation.pk}: {why}")
    return machines


def refusal(machines, verb):
    """Why ``verb`` cannot act on ``machines`` (a ready environment's) now, or None."""
    starts, end, past = VERBS[verb]
    wrong = [f"{m.hostname} is {m.vm.state if m.vm else 'without a VM'}" for m in machines if not _in(m, starts)]
    if wrong:
        return ", ".join(wrong)
    if verb != "revert" and all(m.vm.state == end for m in machines):
        return f"it is {past} already"
    if verb == "revert":
        keepless = [f"{m.hostname} ({m.image.name})" for m in machines if not vms.has_clean_snapshot(m.vm)]
        if keepless:
            return (
                f"{', '.join(keepless)} keep no clean snapshot to go back to "
                "(only a machine of an image that reverts on end keeps one)"
            )
    return None


def offered(machines):
    """The verbs ``machines`` (a ready environment's) may be asked now (its page's buttons)."""
    return [verb for verb in VERBS if refusal(machines, verb) is None]


def _in(machine, states):
    return machine.vm is not None and machine.status == Reservation.Status.READY and machine.vm.state in states


# --- the job ------------------------------------------------------------------------------------


class VerbParams(serializers.Serializer):
    reservation = serializers.IntegerField(min_value=1)
    vms = serializers.ListField(child=serializers.IntegerField(min_value=1), min_length=1, max_length=1000)


def locks(params):
    """The head (one verb at a time) and every machine's VM (no VM action meanwhile)."""
    return [f"reservation:{params['reservation']}", *(f"vm:{vm}" for vm in params["vms"])]


def run(job, verb):
    """``reservation.<verb>``: each machine in turn; on a failure those done are put back."""
    head_id = job.params["reservation"]
    machines = job.step("machines", _machines, head_id, job.params["vms"])
    job.expect(2 * len(machines) + 2)
    done, failed = [], None
    for vm_id, hostname in machines:
        outcome = job.step(f"{verb}-{hostname}", _one, verb, vm_id, actor=job.actor)
        if "error" in outcome:
            failed = (hostname, outcome["error"])
            break
        done.append((vm_id, hostname))
    if failed is None:
        note = f"{VERBS[verb][2]}: {', '.join(h for _, h in machines)}"
        job.db_step("told", _tell, head_id, note)
        return {"reservation": head_id, verb: [h for _, h in machines]}
    undo = UNDO[verb][0]
    # After a failed revert every machine is started again (the failed one too): its disk may
    # be reverted already, and a stopped machine would be one the environment silently lacks.
    back = machines if verb == "revert" else done
    lost = []
    for vm_id, hostname in back:
        outcome = job.step(f"{undo}-{hostname}", _one, undo, vm_id, actor=job.actor)
        if "error" in outcome:
            lost.append(f"{hostname} ({outcome['error']})")
    note = _failure(verb, failed, done, back, lost)
    job.db_step("told", _tell, head_id, note)
    raise Refused(note)


def _failure(verb, failed, done, back, lost):
    hostname, why = failed
    note = f"{hostname} could not be {VERBS[verb][2]}: {why}"
    if verb == "revert":
        reverted = ", ".join(h for _, h in done) or "none"
        note += f"; reverted before it: {reverted}; every machine was started again"
    elif back:
        note += f"; {UNDO[verb][1]} again: {', '.join(h for _, h in back)}"
    if lost:
        note += f"; could not be put back, act on them alone: {', '.join(lost)}"
    return note


def _machines(head_id, vm_ids):
    """``[[vm id, hostname], ...]`` in the order the verb takes them (the head first); the
    machines must still be those the verb was asked for."""
    head = Reservation.objects.get(pk=head_id)
    machines = [[m.vm_id, m.hostname] for m in environments.machines_of(head)]
    if sorted(vm for vm, _ in machines) != sorted(vm_ids):
        raise Refused(f"environment reservation {head_id} changed since it was asked; ask again")
    return machines


def _one(verb, vm_id, *, actor):
    """One machine's part: ``{"state": …}``, or ``{"error": why}`` (recorded, not raised: the job
    then puts the others back, and a retry replays the same outcome)."""
    try:
        if verb == "revert":
            return {"state": _revert(vm_id, actor=actor)}
        if verb == "start":
            return {"state": _start(vm_id, actor=actor)}
        return {"state": lifecycle.power(vm_id, verb, False, actor=actor)}
    except Exception as exc:
        if passes_through(exc):
            raise
        return {"error": fail_reason(exc)}


def _revert(vm_id, *, actor):
    """Off (a suspended guest's saved memory would outlive the revert of its disk), back to the
    clean snapshot, booted as on its first boot; running once its guest answers."""
    vm = load_vm(vm_id)
    driver = drivers.driver_for(vm.host)
    if driver.state(vm.key) != base.VMState.STOPPED:
        driver.stop(vm.key, force=True)
    vms.set_state(vm_id, VM.State.STOPPED, "stopped to revert to its clean state", address=None, actor=actor)
    lifecycle.revert(vm_id, vms.CLEAN_SNAPSHOT, actor=actor)
    return _start(vm_id, actor=actor)


def _start(vm_id, *, actor):
    """Running again whatever it was left as (after a failed revert)."""
    vm = load_vm(vm_id)
    state = drivers.driver_for(vm.host).state(vm.key)
    if state == base.VMState.SUSPENDED:
        return lifecycle.power(vm_id, "resume", False, actor=actor)
    if state != base.VMState.RUNNING:
        lifecycle.boot(vm_id, actor=actor)
    address = lifecycle.wait_address(vm_id)
    lifecycle.ready(vm_id, address, actor=actor)
    return VM.State.RUNNING


def _tell(head_id, note):
    """The outcome in the head's history, and every machine's state with its event (on the head's
    topic: its page, and whoever follows it, hears where each machine is)."""
    head = Reservation.objects.select_related("image").get(pk=head_id)
    status.history(head, note, machines=machine_states(head))


def machine_states(head):
    """``[{"id", "hostname", "status", "vm_state"}, ...]`` of every machine, the head first."""
    rows = environments.machines_of(head)
    return [{"id": m.pk, "hostname": m.hostname, "status": m.status, "vm_state": m.vm and m.vm.state} for m in rows]
