"""Idle reclamation, the acting half: ask a ready reservation's guest (and the web console) who
is there, then do what ``idle.decide`` says: nothing, warn, or end it through the reservation
services. The policy, the clock and the decision are ``reservations/idle.py`` (which the
reservation services use when a reservation becomes ready); this module sits above both.
"""

from django.db import transaction
from django.utils import timezone

from core import events, topics
from reservations import services
from reservations.idle import S, clock_of, decide, policy_for, reason_text
from reservations.models import Reservation, ReservationHistory


def guest_sessions(reservation):
    """The guest's sessions, or ``(None, why)`` when they cannot be known now; ``Invalid`` passes."""
    from drivers import base, registry

    vm = reservation.vm
    if vm is None or vm.host is None:
        return None, "no VM"
    try:
        return registry.driver_for(vm.host).guest_sessions(vm.key), ""
    except base.Invalid:
        raise
    except base.DriverError as exc:
        return None, str(exc)


def console_sessions(reservation, now):
    """The user's web console sessions of the reservation's VM as guest sessions: an open one is
    active now, the latest closed since the clock's start was last active at its close."""
    from console import services as console
    from drivers.base import GuestSession

    if reservation.vm_id is None or reservation.user_id is None:
        return []
    seen = console.activity(reservation.vm_id, reservation.user_id, since=reservation.idle_since, now=now)
    sessions = [GuestSession("console")] if seen["open"] else []
    if seen["last_closed"] is not None:
        quiet = max(0.0, (now - seen["last_closed"]).total_seconds())
        sessions.append(GuestSession("console", idle_seconds=quiet))
    return sessions


def check(reservation_id, now=None, *, actor):
    """Ask the reservation's guest who is logged in and act: nothing, warn, or end it."""
    from drivers import base

    reservation = (
        Reservation.objects.select_related("vm", "vm__host", "image", "block__group", "user")
        .filter(pk=reservation_id, status=S.READY, idle_check_at__isnull=False)
        .first()
    )
    if reservation is None:
        return {"reservation": reservation_id, "action": "none", "note": "not ready or no policy"}
    try:
        sessions, why = guest_sessions(reservation)  # no transaction is open across this call
    except base.Invalid as exc:
        return _disarm(reservation, f"idle policy not applied: {exc}")
    now = now or timezone.now()
    if sessions is not None:  # a console alone never ends one whose guest cannot tell now
        sessions = [*sessions, *console_sessions(reservation, now)]
    policy = policy_for(reservation)
    decision = decide(policy, clock_of(reservation), sessions, now)
    outcome = {
        "reservation": reservation.pk,
        "action": decision.action,
        "kind": decision.kind,
        "sessions": None if sessions is None else len(sessions),
    }
    if why:
        outcome["unknown"] = why[:200]
    with transaction.atomic():
        c = decision.clock
        updated = Reservation.objects.filter(pk=reservation.pk, status=S.READY, idle_check_at__isnull=False).update(
            idle_since=c.idle_since,
            connected_at=c.connected_at,
            idle_warned_at=c.warned_at,
            idle_check_at=decision.next_check,
            idle_deadline=decision.deadline,
            idle_kind=decision.kind,
        )
        if not updated:
            return {**outcome, "action": "none", "note": "changed meanwhile"}
        if decision.action == "warn":
            _warn(reservation, decision, now)
    if decision.action == "end":
        _reclaim(reservation, policy, decision, now, actor=actor)
    return outcome


def _disarm(reservation, note):
    with transaction.atomic():
        if Reservation.objects.filter(pk=reservation.pk, status=S.READY).update(idle_check_at=None):
            ReservationHistory.objects.create(reservation=reservation, status=reservation.status, reason=note[:500])
    return {"reservation": reservation.pk, "action": "disarmed", "note": note}


def _warn(reservation, decision, now):
    minutes = max(1, round((decision.deadline - now).total_seconds() / 60))
    targets = [f"reservation.{reservation.pk}", topics.user_topic(reservation.user_id)]
    data = {
        "id": reservation.pk,
        "minutes": minutes,
        "at": decision.deadline.isoformat(),
        "since": decision.clock.idle_since.isoformat(),
    }
    events.emit("reservation.idle", data, targets)


def _reclaim(reservation, policy, decision, now, *, actor):
    from core.errors import Conflict

    with transaction.atomic():
        marked = Reservation.objects.filter(pk=reservation.pk, status=S.READY).update(
            reclaimed=decision.kind, reclaimed_at=now, idle_check_at=None, idle_deadline=None
        )
        if not marked:
            return
        reservation.refresh_from_db()
        try:
            services.end(reservation, reason_text(decision.kind, policy), actor=actor)
        except Conflict:  # ended by its user meanwhile: not reclaimed after all
            Reservation.objects.filter(pk=reservation.pk).update(reclaimed="", reclaimed_at=None)
