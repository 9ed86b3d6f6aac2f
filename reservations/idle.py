"""Idle reclamation: end the ready reservations nobody uses, as Apache VCL does.

Contract:

- A reservation's policy (``policy_for``) is its image's ``IdlePolicy``, else its usage group's
  (its block's group, else its user's first group: the group the usage report counts it under),
  else the site's ``IDLE_NO_SHOW_MINUTES`` / ``IDLE_MINUTES`` / ``IDLE_WARN_MINUTES``. It is read
  when the reservation becomes ready (``arm``): a policy changed later applies from the next ready.
- The idle clock runs from ``idle_since``: the moment it became ready (its start, if built
  ahead of it), then the last activity seen.
  Activity is a login in the guest (the driver's ``guest_sessions``: the QEMU guest
  agent's ``guest-get-users`` on libvirt, the simulator's sessions) or its last input where the
  guest reports one, and the reservation's user's web console sessions of its VM (vclmgr
  proxies them: one open is activity now, one closed is activity at its close), so a user
  working only through the console, with no login the guest reports, is no no-show.
  Never connected: ended ``no_show`` once ``no_show_minutes`` passed (or,
  with that off, by the idle limit). Connected, then nobody logged in (or no input) for
  ``idle_minutes``: warned ``warn_minutes`` before (event ``reservation.idle``: a mail and the
  page's banner), then ended ``idle``. Activity after the warning resets the clock and the warning.
- ``decide`` is the pure state machine (no I/O); ``reclaim.check`` asks the guest (no transaction open
  across the driver call) and writes the outcome by conditional UPDATE on a ready row, so a
  reservation ended or extended meanwhile is left alone. A guest that cannot tell (``Invalid``:
  the hypervisor does not report logins) is disarmed with a note in its history; one whose agent
  does not answer now changes nothing and is asked again later (an unknown is never idleness).
- ``due(now)`` is one indexed query (status, ``idle_check_at``): cheap when nothing is due; the
  periodic task submits one ``reservation.idle_check`` job only when something is.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, JSONObject
from django.utils import timezone

from reservations.models import BlockAllocation, IdlePolicy, Reservation

log = logging.getLogger(__name__)
S = Reservation.Status
NO_SHOW, IDLE = "no_show", "idle"
MIN_RECHECK = timedelta(seconds=1)


def policy_time(n):
    """``n`` minutes of a policy. Not read from the environment: only the real-VM test shortens
    the minute (``IDLE_MINUTE_SECONDS`` in tests/settings.py) to see reclamation in seconds."""
    return timedelta(seconds=n * settings.IDLE_MINUTE_SECONDS)


@dataclass(frozen=True)
class Policy:
    no_show_minutes: int
    idle_minutes: int
    warn_minutes: int
    source: str  # "image <name>", "group <name>" or "site"

    @property
    def active(self):
        return bool(self.no_show_minutes or self.idle_minutes)


@dataclass(frozen=True)
class Clock:
    """What a reservation row knows of its idleness."""

    idle_since: datetime
    connected_at: datetime | None = None
    warned_at: datetime | None = None


@dataclass(frozen=True)
class Decision:
    action: str  # "none" | "warn" | "end"
    clock: Clock
    kind: str  # what the deadline is for: no_show | idle ("" with no deadline)
    deadline: datetime | None  # when it is reclaimed if nothing changes
    next_check: datetime | None


def site_policy():
    return Policy(settings.IDLE_NO_SHOW_MINUTES, settings.IDLE_MINUTES, settings.IDLE_WARN_MINUTES, "site")


def with_policy(reservations):
    """``reservations`` (a queryset) with each one's policy row read along, in the same
    statement, as ``idle_policy_row`` (``policy_for`` then reads none): the image's row first,
    else its group's, as one subquery; None where neither has one (the site's applies)."""
    from django.contrib.auth import get_user_model

    block_group = BlockAllocation.objects.filter(pk=OuterRef(OuterRef("block_id"))).values("group_id")
    user_group = (
        get_user_model()
        .groups.through.objects.filter(user_id=OuterRef(OuterRef("user_id")))
        .order_by("group_id")
        .values("group_id")[:1]
    )
    # (The group: the reservation's block's, else the user's first by id, as the usage report counts it.)
    mine = Q(image_id=OuterRef("image_id")) | Q(group_id=Coalesce(Subquery(block_group), Subquery(user_group)))
    image_first = F("image_id").asc(nulls_last=True)  # the image's row (a group's has no image)
    row = JSONObject(
        no_show="no_show_minutes",
        idle="idle_minutes",
        warn="warn_minutes",
        image_id="image_id",
        image="image__name",
        group="group__name",
    )
    first = IdlePolicy.objects.filter(mine).order_by(image_first, "pk").values(row=row)[:1]
    return reservations.annotate(idle_policy_row=Subquery(first))


def policy_for(reservation):
    """The image's policy, else its group's (the class's group, else the user's first group, as
    the usage report counts it), else the site's: one SELECT (``with_policy``), at every
    reservation's ready; none for a reservation already read ``with_policy``."""
    try:
        row = reservation.idle_policy_row
    except AttributeError:
        rows = with_policy(Reservation.objects.filter(pk=reservation.pk))
        row = rows.values_list("idle_policy_row", flat=True).first()
    if row is None:
        return site_policy()
    source = f"image {row['image']}" if row["image_id"] == reservation.image_id else f"group {row['group']}"
    return Policy(row["no_show"], row["idle"], row["warn"], source)


def deadline(policy, clock):
    """``(kind, when)`` the reservation is reclaimed if nothing changes; ``("", None)``: never."""
    if clock.connected_at is None and policy.no_show_minutes:
        return NO_SHOW, clock.idle_since + policy_time(policy.no_show_minutes)
    if policy.idle_minutes:
        return IDLE, clock.idle_since + policy_time(policy.idle_minutes)
    return "", None


def decide(policy, clock, sessions, now, check_seconds=None):
    """The state machine. ``sessions``: the guest's ``GuestSession`` list, or None (not known)."""
    check = timedelta(seconds=check_seconds or settings.IDLE_CHECK_SECONDS)
    if sessions is not None:
        active = [now - timedelta(seconds=s.idle_seconds) if s.idle_seconds is not None else now for s in sessions]
        last = max(active, default=None)
        connected_at = clock.connected_at or (now if sessions else None)
        if last is not None and last > clock.idle_since:
            clock = Clock(idle_since=min(last, now), connected_at=connected_at, warned_at=None)
        else:
            clock = Clock(clock.idle_since, connected_at, clock.warned_at)
    kind, at = deadline(policy, clock)
    if at is None:
        return Decision("none", clock, kind, None, None)
    warn_at = at - policy_time(policy.warn_minutes) if kind == IDLE and policy.warn_minutes else None
    if sessions is not None and now >= at:
        return Decision("end", clock, kind, at, None)
    action = "none"
    if sessions is not None and warn_at is not None and now >= warn_at and clock.warned_at is None:
        action, clock = "warn", Clock(clock.idle_since, clock.connected_at, now)
    # Asked again at the check interval, but no later than the warning or the end falls due.
    upcoming = [t for t in (at, warn_at if clock.warned_at is None else None) if t is not None and t > now]
    next_check = min([now + check, *upcoming])
    return Decision(action, clock, kind, at, max(next_check, now + MIN_RECHECK))


def clock_of(reservation):
    return Clock(reservation.idle_since, reservation.connected_at, reservation.idle_warned_at)


# --- writes ----------------------------------------------------------------------------


def set_policy(*, actor, image=None, group=None, no_show_minutes=15, idle_minutes=60, warn_minutes=10):
    """Create or change the idle policy of ``image`` or ``group`` (one of them); returns it."""
    from django.core.exceptions import ValidationError

    from core import changelog
    from core.changelog import Actor

    if (image is None) == (group is None):
        raise ValidationError({"image": ["give an image or a group, not both"]})
    values = {"no_show_minutes": no_show_minutes, "idle_minutes": idle_minutes, "warn_minutes": warn_minutes}
    if idle_minutes and warn_minutes >= idle_minutes:
        raise ValidationError({"warn_minutes": ["the warning must come before the end: less than idle_minutes"]})
    with transaction.atomic():
        row, created = IdlePolicy.objects.select_for_update().get_or_create(image=image, group=group, defaults=values)
        old = {k: getattr(row, k) for k in values}
        for k, v in values.items():
            setattr(row, k, v)
        row.full_clean()
        row.save()
        changes = {k: [None if created else old[k], v] for k, v in values.items() if created or old[k] != v}
        changelog.record(row, "create" if created else "update", Actor.of(actor), changes, "idle policy")
    return row


def arm(reservation, now):
    """The idle fields of a reservation becoming ready now (its policy read once, here). One
    built ahead of its start (a class session's seat, a reservation for later) is idle from
    its start, not from ready: a student is no no-show for not logging in before the session."""
    since = max(now, reservation.start) if reservation.start is not None else now
    values = {
        "idle_since": since,
        "connected_at": None,
        "idle_warned_at": None,
        "idle_check_at": None,
        "idle_deadline": None,
        "idle_kind": "",
    }
    policy = policy_for(reservation)
    # An image's template waits for its maintainer between sessions of work: never reclaimed.
    # An environment is watched at its entry machine (the head): the others are reached from it.
    if policy.active and reservation.template_of_id is None and reservation.head_id is None:
        decision = decide(policy, Clock(since), None, now)
        values.update(idle_check_at=decision.next_check, idle_deadline=decision.deadline, idle_kind=decision.kind)
    return values


def due(now=None, limit=500):
    """Ids of the ready reservations whose guest is to be asked now (one indexed query)."""
    now = now or timezone.now()
    rows = Reservation.objects.filter(status=S.READY, idle_check_at__lte=now).order_by("idle_check_at")
    return list(rows.values_list("pk", flat=True)[:limit])


def reason_text(kind, policy):
    if kind == NO_SHOW:
        return f"reclaimed: no-show (nobody logged in within {policy.no_show_minutes} min of ready)"
    return f"reclaimed: idle (no login or input for {policy.idle_minutes} min)"


def countdown(reservation, now=None):
    """What the user's page shows: ``{"kind", "at", "minutes", "warned"}`` or None."""
    at = reservation.idle_deadline
    if reservation.status != S.READY or reservation.idle_check_at is None or at is None:
        return None
    now = now or timezone.now()
    return {
        "kind": reservation.idle_kind,
        "at": at,
        "minutes": max(0, round((at - now).total_seconds() / 60)),
        "warned": reservation.idle_warned_at is not None,
    }
