"""The scheduler's tick: start what is due, end what is over, warn what ends soon, finish
endings that stalled, let hosts scheduled to leave service go, and expire the approval
requests nobody decided in time."""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from capacity import services as capacity
from core import events, topics
from core.changelog import Actor
from core.errors import Conflict
from jobs import services as jobs
from reservations import approvals, ending, reserving
from reservations.models import Reservation

S = Reservation.Status


def tick(now=None, *, actor=None):
    """Start what is due, end what is over, warn what ends soon. Safe to run anywhere, any time."""
    now = now or timezone.now()
    actor = actor or Actor(name="scheduler")
    lead = timedelta(minutes=settings.RESERVATION_LEAD_MINUTES)
    done = {"started": 0, "ended": 0, "warned": 0, "expired": 0}
    due = Reservation.objects.filter(status=S.PENDING, start__lte=now + lead, end__gt=now, head__isnull=True)
    for rid, environment in due.values_list("pk", "environment_id"):
        # An environment's machines start together, or none does (its head's turn starts them all).
        with transaction.atomic():
            machines = [rid]
            if environment:
                machines += list(Reservation.objects.filter(head_id=rid, status=S.PENDING).values_list("pk", flat=True))
            if all([reserving.provision(pk, "its start is near: building the VM", actor=actor) for pk in machines]):
                done["started"] += 1
    for reservation in Reservation.objects.filter(status__in=Reservation.ACTIVE, end__lte=now).select_related("vm"):
        try:
            ending.end(reservation, "its time is over", actor=actor)
            done["ended" if reservation.status != S.PENDING else "expired"] += 1
        except Conflict:
            pass
    warn_at = now + timedelta(minutes=settings.RESERVATION_WARN_MINUTES)
    ready = Reservation.objects.filter(status=S.READY, head__isnull=True)  # an environment: told once, by its head
    for reservation in ready.filter(warned=False, end__lte=warn_at, end__gt=now):
        with transaction.atomic():
            if Reservation.objects.filter(pk=reservation.pk, warned=False).update(warned=True):
                minutes = max(1, round((reservation.end - now).total_seconds() / 60))
                targets = [f"reservation.{reservation.pk}", topics.user_topic(reservation.user_id)]
                events.emit(
                    "reservation.ending",
                    {"id": reservation.pk, "minutes": minutes, "end": reservation.end.isoformat()},
                    targets,
                )
                done["warned"] += 1
    done["refinished"] = _finish_stalled_endings(now, actor=actor)
    # A host scheduled to leave service "after its reservations" goes once the last has ended.
    left = capacity.apply_scheduled(now, actor=actor)
    if left:
        done["hosts_left_service"] = left
    expired = approvals.expire_due(now)
    if expired:
        done["approvals_expired"] = expired
    return done


STALLED_ENDING = timedelta(minutes=10)


def _finish_stalled_endings(now, *, actor):
    """Queue ``reservation.finish`` again for a reservation still ending a while after its
    last job (an admin canceled its finish job, or it failed): idempotent, it settles it.
    Returns how many."""
    from jobs.models import Job

    stalled = Reservation.objects.filter(status=S.ENDING, updated__lte=now - STALLED_ENDING)
    vms_of = dict(stalled.values_list("pk", "vm_id")[:100])  # every tick: usually none
    ids = list(vms_of)
    if not ids:
        return 0
    # Not while one of its jobs or its VM's is unfinished (a slow teardown), nor again soon after
    # one of its own (a finish that keeps failing is tried once every STALLED_ENDING).
    mine = Job.objects.filter(params__reservation__in=ids)
    busy = mine.exclude(status__in=Job.FINAL) | mine.filter(received__gt=now - STALLED_ENDING)
    busy_ids = set(busy.values_list("params__reservation", flat=True))
    tearing = Job.objects.filter(params__vm__in=[v for v in vms_of.values() if v]).exclude(status__in=Job.FINAL)
    busy_vms = set(tearing.values_list("params__vm", flat=True))
    busy_ids |= {rid for rid, vm_id in vms_of.items() if vm_id in busy_vms}
    for rid in ids:
        if rid not in busy_ids:
            jobs.submit(
                "reservation.finish",
                {"reservation": rid},
                actor=actor,
                reason=f"reservation {rid}: still ending {STALLED_ENDING} after its teardown",
            )
    return len(set(ids) - busy_ids)
