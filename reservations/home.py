"""A signed-in user's home: their reservations (live) and classes, each with the next thing to
do (their runs: ``runs.home``; the page puts both together). Read-only.

Contract: ``for_user(user, now)`` gives the user's own reservations that are active, ending, or
failed within ``FAILED_SHOWN`` (never anyone else's), each with ``next_action``: ``connect``
(ready), ``wait`` (booked, being built, ending), ``why`` (failed: the reason); and the classes
of their groups with a session now or later, with their seat or the offer to take one; and their
requests waiting for approval (or decided within ``FAILED_SHOWN``), with how many requests wait
for their own decision when they approve.
"""

from datetime import timedelta

from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from core.next_action import Action
from reservations import approvals, idle
from reservations.models import ApprovalRequest, BlockAllocation, Reservation

S = Reservation.Status
FAILED_SHOWN = timedelta(hours=24)
SHOWN = 20


def next_action(reservation):
    detail = reverse("reservations:detail", args=[reservation.pk])
    status = reservation.status
    if status == S.READY:
        return Action("connect", "Connect", detail + "#connection", _idle_note(reservation))
    if status in (S.REQUESTED, S.PENDING):
        return Action("wait", f"Wait: starts {timezone.localtime(reservation.start):%Y-%m-%d %H:%M %Z}", detail)
    if status in (S.PLACING, S.PROVISIONING):
        return Action("wait", "Wait: the machine is being built", detail)
    if status == S.ENDING:
        return Action("wait", "Wait: ending", detail)
    if status == S.FAILED:
        first_line = (reservation.error or "see its history").splitlines()[0][:200]
        return Action("why", f"See why it failed: {first_line}", detail)
    return Action("open", "Open", detail)


def _idle_note(reservation):
    left = idle.countdown(reservation)
    if left is None:
        return ""
    if left["kind"] == idle.NO_SHOW:
        return f"ended at {timezone.localtime(left['at']):%H:%M %Z} (in about {left['minutes']} min) unless you connect"
    return f"idle: ended at {timezone.localtime(left['at']):%H:%M %Z} (in about {left['minutes']} min) unless used"


def reservations_of(user, now=None):
    now = now or timezone.now()
    shown = Q(status__in=(*Reservation.ACTIVE, S.ENDING)) | Q(status=S.FAILED, updated__gte=now - FAILED_SHOWN)
    rows = Reservation.objects.filter(shown, user=user).select_related("image").order_by("start", "pk")[:SHOWN]
    return [(r, next_action(r)) for r in rows]


def classes_of(user, now=None):
    """The classes of the user's groups with a session now or later: ``[(block, seat_id|None)]``."""
    now = now or timezone.now()
    classes = (
        BlockAllocation.objects.filter(group__in=user.groups.all(), canceled=False)
        .filter(seat_reservations__end__gt=now)
        .distinct()
        .select_related("image", "group")
        .order_by("start")
    )
    held = dict(
        Reservation.objects.filter(user=user, block__in=classes, status__in=Reservation.ACTIVE, end__gt=now)
        .order_by("-start")
        .values_list("block_id", "pk")
    )
    return [(b, held.get(b.pk)) for b in classes]


def approvals_of(user, now=None):
    """``{"mine": [request], "to_decide": n}``: the user's requests waiting or lately decided."""
    now = now or timezone.now()
    shown = Q(status=ApprovalRequest.Status.PENDING) | Q(decided_at__gte=now - FAILED_SHOWN)
    mine = list(ApprovalRequest.objects.filter(shown, requester=user).order_by("-created")[:SHOWN])
    return {"mine": mine, "to_decide": approvals.decidable(user).count()}


def for_user(user, now=None):
    now = now or timezone.now()
    return {
        "reservations": reservations_of(user, now),
        "classes": classes_of(user, now),
        "approvals": approvals_of(user, now),
    }
