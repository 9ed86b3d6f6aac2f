"""A reservation's status changes: the conditional UPDATE (``move``: of two racing verbs one
wins, the other changes nothing), the history row with its reason and the
``reservation.changed`` event every change emits, and ``Unsaved`` (the writes to a row just
inserted, kept until its acceptance is done)."""

from django.db import transaction
from django.utils import timezone

from core import events, topics
from reservations.models import Reservation, ReservationHistory


class Unsaved:
    """The writes to a reservation just inserted in the caller's transaction, kept until its
    acceptance is done (``write``): its changed fields in one UPDATE and its history rows in
    one INSERT, instead of one of each per status it passes through (pending, provisioning).
    Its events are emitted as the statuses change (the transaction's batch writes them)."""

    def __init__(self):
        self.fields, self.history = set(), []

    def change(self, reservation, **values):
        for name, value in values.items():
            setattr(reservation, name, value)
        self.fields.update(values)

    def write(self, reservation):
        if self.fields:
            reservation.save(update_fields=sorted(self.fields))
        if self.history:
            ReservationHistory.objects.bulk_create(self.history)
        self.fields, self.history = set(), []


def history(reservation, reason, unsaved=None, **told):
    """A history row (kept in ``unsaved`` when given, else written now) and its event (``told``:
    more for its data, such as an environment's ``machines``)."""
    row = ReservationHistory(reservation=reservation, status=reservation.status, reason=reason[:500])
    if unsaved is None:
        row.save(force_insert=True)
    else:
        unsaved.history.append(row)
    emit(reservation, reason, **told)


def emit(reservation, reason="", **told):
    data = {
        "id": reservation.pk,
        "status": reservation.status,
        "image": reservation.image_id,
        "start": reservation.start.isoformat(),
        "end": reservation.end.isoformat(),
        "vm": reservation.vm_id,
        "reason": reason,
        "error": reservation.error,
        "degraded": reservation.degraded,
        **told,
    }
    events.emit("reservation.changed", data, targets(reservation))


def move(reservation, old, new, reason, *, savepoint=True, **values):
    """Change status ``old`` → ``new`` if it still is ``old`` (a conditional UPDATE: two
    schedulers or a user and the scheduler never both act). Returns the row or None.

    ``reservation``: an id (the row is read back after the UPDATE), or a row the caller has
    just read or written in its transaction, which is brought up to date in memory instead.
    """
    olds = old if isinstance(old, (tuple, list)) else (old,)
    known = isinstance(reservation, Reservation)
    reservation_id = reservation.pk if known else reservation
    now = timezone.now()
    with transaction.atomic(savepoint=savepoint):
        updated = Reservation.objects.filter(pk=reservation_id, status__in=olds).update(
            status=new, updated=now, **values
        )
        if not updated:
            return None
        if known:
            for name, value in {"status": new, "updated": now, **values}.items():
                setattr(reservation, name, value)
        else:
            reservation = Reservation.objects.select_related("image").get(pk=reservation_id)
        history(reservation, reason)
    return reservation


def targets(reservation):
    """Who hears of a reservation's change: its own topic (and its environment head's), the
    admins and its user."""
    targets = [f"reservation.{reservation.pk}", "admin"]
    if reservation.head_id:  # an environment's machine: its head's page shows it live; its user
        return [*targets, f"reservation.{reservation.head_id}"]  # hears of the environment (the head)
    if reservation.user_id:
        targets.append(topics.user_topic(reservation.user_id))
    return targets
