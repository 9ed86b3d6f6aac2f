"""Reservation jobs: the steps that follow a VM job (``vm.create`` → settle, teardown → finish).

Each runs after the VM job it depends on ended, whatever its status, and reads the outcome
from the database; both are idempotent, so a retried job changes nothing twice.
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
