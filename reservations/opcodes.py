"""Reservation jobs: the steps that follow a VM job (``vm.create`` → settle, teardown → finish),
``reservation.idle_check`` (ask the guests of the ready reservations due for it who is logged in;
warn or reclaim the idle ones, see ``reservations.idle``),
``node.replace_reservations`` (a host drained or taken offline: move its future claims) and
``node.reprovision`` (a host that stopped answering: rebuild its reservations' VMs elsewhere) and
``reservation.suspend`` / ``resume`` / ``revert`` (every machine of an environment, as one: see
``reservations.power``).

The first two run after the VM job they depend on ended, whatever its status, and read the outcome
from the database; all are idempotent, so a retried job changes nothing twice.
"""

from rest_framework import serializers

from jobs.registry import opcode
from reservations import idle, power, reclaim, services


class ReservationParams(serializers.Serializer):
    reservation = serializers.IntegerField(min_value=1)


def reservation_lock(params):
    return [f"reservation:{params['reservation']}"]


@opcode("reservation.settle", params=ReservationParams, locks=reservation_lock)
def reservation_settle(job):
    """After the VM build: mark the reservation ready, retry once on another host, or fail it."""
    # Database only: the reservation's change commits with the job's lease-fenced end.
    return job.last_db_step("settle", services.settle, job.params["reservation"], actor=job.actor)


@opcode("reservation.finish", params=ReservationParams, locks=reservation_lock)
def reservation_finish(job):
    """After the teardown: mark the reservation ended and give its capacity back."""
    return job.step("finish", services.finish, job.params["reservation"], actor=job.actor)


@opcode("reservation.end_template", params=ReservationParams, locks=reservation_lock)
def reservation_end_template(job):
    """After a template's publish succeeded: end the template (its VM torn down)."""
    return job.step("end", services.end_published, job.params["reservation"], actor=job.actor)


class HostParams(serializers.Serializer):
    hypervisor = serializers.IntegerField(min_value=1)


def host_lock(params):
    return [f"replace-reservations:{params['hypervisor']}"]


@opcode("node.replace_reservations", params=HostParams, locks=host_lock, staff_only=True)
def node_replace_reservations(job):
    """Move the future reservations' claims off a drained or offline host, one step (and one
    transaction) each; what finds no room elsewhere is flagged and its user and the admins told."""
    host = job.params["hypervisor"]
    ids = job.step("list", services.future_on_host, host)
    job.expect(len(ids) + 1)
    outcomes = [job.step(f"replace-{rid}", services.replace_off_host, rid, host, actor=job.actor) for rid in ids]
    moved = [o["reservation"] for o in outcomes if o.get("moved")]
    degraded = [o["reservation"] for o in outcomes if o.get("degraded")]
    return {"hypervisor": host, "moved": moved, "degraded": degraded}


@opcode("node.reprovision", params=HostParams, locks=host_lock, staff_only=True)
def node_reprovision(job):
    """A host that stopped answering is offline: rebuild the reservations whose VMs ran on it
    on other hosts from their images (or fail them, per image), one step (one transaction) each."""
    host = job.params["hypervisor"]
    ids = job.step("list", services.on_dead_host, host)
    job.expect(len(ids) + 1)
    outcomes = [job.step(f"rebuild-{rid}", services.reprovision_off_host, rid, host, actor=job.actor) for rid in ids]
    return {
        "hypervisor": host,
        "rebuilt": [o["reservation"] for o in outcomes if o.get("rebuilt")],
        "failed": [o["reservation"] for o in outcomes if o.get("failed")],
    }


@opcode("reservation.idle_check", locks=lambda params: ["reservation-idle-check"], staff_only=True)
def reservation_idle_check(job):
    """Ask the guests of the ready reservations due for an idle check who is logged in; warn
    or end the idle ones (one step each: a driver call, then one short transaction)."""
    ids = job.step("list", idle.due)
    job.expect(len(ids) + 1)
    outcomes = [job.step(f"check-{rid}", reclaim.check, rid, actor=job.actor) for rid in ids]
    return {
        "checked": len(ids),
        "warned": [o["reservation"] for o in outcomes if o["action"] == "warn"],
        "ended": [o["reservation"] for o in outcomes if o["action"] == "end"],
        "unknown": [o["reservation"] for o in outcomes if o.get("unknown") or o["action"] == "disarmed"],
    }


def _environment_opcode(verb):
    @opcode(
        f"reservation.{verb}",
        params=power.VerbParams,
        locks=power.locks,
        description=f"{verb.capitalize()} every machine of an environment reservation, as one.",
    )
    def run(job):
        return power.run(job, verb)

    return run


for _verb in power.VERBS:
    _environment_opcode(_verb)
