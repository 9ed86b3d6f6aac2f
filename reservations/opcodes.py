"""Reservation jobs: the steps that follow a VM job (``vm.create`` → settle, teardown → finish),
and ``node.replace_reservations`` (a host drained or taken offline: move its future claims).

The first two run after the VM job they depend on ended, whatever its status, and read the outcome
from the database; all are idempotent, so a retried job changes nothing twice.
"""

from rest_framework import serializers

from provisioning.jobs.registry import opcode
from reservations import services


class ReservationParams(serializers.Serializer):
    reservation = serializers.IntegerField(min_value=1)


def reservation_lock(params):
    return [f"reservation:{params['reservation']}"]


@opcode("reservation.settle", params=ReservationParams, locks=reservation_lock)
def reservation_settle(job):
    """After the VM build: mark the reservation ready, retry once on another host, or fail it."""
    return job.step("settle", services.settle, job.params["reservation"], actor=job.actor)


@opcode("reservation.finish", params=ReservationParams, locks=reservation_lock)
def reservation_finish(job):
    """After the teardown: mark the reservation ended and give its capacity back."""
    return job.step("finish", services.finish, job.params["reservation"], actor=job.actor)


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
