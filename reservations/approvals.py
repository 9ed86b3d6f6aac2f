"""Approvals: a request that needs an approver waits for one. One engine for reservations and classes.

A reservation of an image that ``requires_approval`` (``ask_reservation``), an environment with a
machine of such an image (``environments.ask``: one request for the whole environment), and a
class of such an image or one asked to require it (``classes.services.create_class``, through
``ask``), is not made
at once: an ``ApprovalRequest`` keeps what was asked and nothing is claimed. The users who may
decide it (``accounts.access.approvers_for``: administrators, and approvers of the requester's
groups) are told by the event ``approval.requested`` on their user topics (notifications mails
them; the approvals page lists it). An approver approves or denies it with a reason (``approve``,
``deny``); a requester never decides their own. Approval makes the thing then, through the verb an
unapproved request goes through (``PROCEED``, one per kind: ``reserving.reserve`` for a
reservation and ``environments.reserve`` for an environment, registered by this app;
``create_class`` by classes), so quotas and capacity are
checked then and claimed then: a request that no longer fits is ``failed`` with the reason.
Unanswered requests expire after ``APPROVAL_EXPIRY_HOURS``, or at the start they asked for if that
is earlier (``expire_due``, run by the reservations clock). The requester is told of every outcome
by the event ``approval.decided`` on their user topic (notifications mails it).

Why nothing is held while a request waits: an answer may take days, and capacity held for a
request that may well be denied refuses others meanwhile. The price: an approved request may find
the room gone, and then says so.

Administrators' own requests do not wait: they could decide them anyway, and nobody above them would.
"""

from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from accounts import access
from core import changelog, events, topics
from core.changelog import Actor
from core.errors import Conflict
from core.hooks import Hook
from reservations import reserving
from reservations.models import ApprovalRequest

A = ApprovalRequest.Status
K = ApprovalRequest.Kind
EXPIRY_ACTOR = Actor(name="approval expiry")

#: kind -> ``proceed(request, *, actor)``: make what the request asked (as if never gated), return
#: the id of what it made; ``ValidationError`` if it cannot be made now.
PROCEED: Hook[Callable] = Hook("reservations.approvals.PROCEED", keyed=True, single=True)


def needs_approval(user, image, also=False):
    """Does a request of ``user`` for ``image`` wait for an approver? ``also``: the request itself
    asks for approval (a class that requires it)."""
    return (also or image.requires_approval) and not access.is_admin(user)


# --- asking ---------------------------------------------------------------------------------------


def ask(kind, requester, image, payload, summary, *, actor, starts_at=None, request_key="", now=None):
    """Record a request that waits for approval and tell its approvers; returns it. ``starts_at``:
    when the thing would start (it expires then at the latest; None: it starts when approved)."""
    now = now or timezone.now()
    if request_key:
        existing = ApprovalRequest.objects.filter(requester=requester, request_key=request_key).first()
        if existing is not None:
            return existing
    expires = now + timedelta(hours=settings.APPROVAL_EXPIRY_HOURS)
    if starts_at is not None:
        expires = min(expires, starts_at)
    try:
        with transaction.atomic():
            request = ApprovalRequest.objects.create(
                kind=kind,
                requester=requester,
                image=image,
                payload=payload,
                summary=summary[:300],
                request_key=request_key,
                starts_at=starts_at,
                expires_at=expires,
            )
            changelog.record(request, "create", Actor.of(actor), reason=f"waiting for approval: {request.summary}")
            approvers = list(access.approvers_for(requester).values_list("pk", flat=True))
            events.emit("approval.requested", _data(request), [topics.user_topic(pk) for pk in approvers])
    except IntegrityError:  # the same form, submitted twice at once: the other one won
        existing = ApprovalRequest.objects.filter(requester=requester, request_key=request_key).first()
        if request_key and existing is not None:
            return existing
        raise
    return request


def ask_reservation(
    user, image, *, actor, start=None, end=None, duration=None, ssh_key="", request_key="", size=None, gpus=None,
    gpu_model=None, now=None,
):  # fmt: skip
    """``reserving.reserve`` (the same arguments), or, for an image that requires approval, a
    request waiting for it. Returns the reservation or the ``ApprovalRequest``. The request is
    checked as a reservation is (validation, quotas) before anyone is asked, so an approver never
    sees one that could not be; capacity is not (it is claimed, and checked, when approved)."""
    ask_for = {"ssh_key": ssh_key, "request_key": request_key, "size": size, "gpus": gpus, "gpu_model": gpu_model}
    if not needs_approval(user, image):
        return reserving.reserve(user, image, actor=actor, start=start, end=end, duration=duration, now=now, **ask_for)
    now = now or timezone.now()
    if end is None and duration is None:
        raise ValidationError({"end": ["give an end or a duration"]})
    begin = start or now
    last = end if end is not None else begin + duration
    errors = reserving.validate(user, image, begin, last, now, size)
    gpus, gpu_model = reserving.gpu_ask(image, gpus, gpu_model)
    errors.update(reserving.gpu_errors(gpus, gpu_model))
    if errors:
        raise ValidationError(errors)
    timing, when, starts_at = asked_time(begin, last, now)
    payload = {
        "image": image.pk,
        **timing,
        "ssh_key": ssh_key.strip(),
        "size": size or {},
        "gpus": gpus,
        "gpu_model": gpu_model,
    }
    summary = f"a reservation of {image.name}{when}"
    return ask(
        K.RESERVATION, user, image, payload, summary, actor=actor, starts_at=starts_at, request_key=request_key, now=now
    )


def asked_time(begin, last, now):
    """What a reservation's request asks of time, from ``begin`` to ``last``: its payload's
    ``start`` (None: when approved) and ``seconds``, its summary's words, and its ``starts_at``.
    A start within ``START_GRACE`` of now means "now": it then starts when approved."""
    later = begin - reserving.START_GRACE > now
    first = begin if later else now
    timing = {"start": first.isoformat() if later else None, "seconds": int((last - first).total_seconds())}
    # No clock time in the words: they are read by approvers in their own zones, so mails and
    # pages say ``starts_at`` (and the end) in each reader's zone beside them.
    when = "" if later else ", as soon as approved,"
    return timing, f"{when} for {span(last - first)}", first if later else None


def asked_window(payload):
    """``(start, duration)`` of a reservation's request as ``asked_time`` kept them."""
    from datetime import datetime

    start = datetime.fromisoformat(payload["start"]) if payload.get("start") else None
    return start, timedelta(seconds=payload["seconds"])


def span(delta):
    minutes = int(delta.total_seconds() // 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def proceed_reservation(request, *, actor):
    """``PROCEED`` for a reservation: reserve what was asked, now (the requester's quotas, the
    capacity then). Returns the reservation's id."""
    data = request.payload
    start, duration = asked_window(data)
    reservation = reserving.reserve(
        request.requester,
        request.image,
        actor=actor,
        start=start,
        duration=duration,
        ssh_key=data.get("ssh_key", ""),
        size=data.get("size") or None,
        gpus=data.get("gpus", 0),
        gpu_model=data.get("gpu_model", ""),
    )
    return reservation.pk


# --- deciding -------------------------------------------------------------------------------------


def may_decide(user, request):
    """May ``user`` approve or deny ``request`` (pending or not)? Never the requester."""
    groups = request.requester.groups.values_list("pk", flat=True)
    return access.may_approve(user, request.requester_id, groups)


def decidable(user):
    """The pending requests ``user`` may decide (none for a user who is no approver)."""
    if not (access.is_admin(user) or access.can(user, "approve")):
        return ApprovalRequest.objects.none()
    found = ApprovalRequest.objects.filter(status=A.PENDING).exclude(requester=user)
    scope = access.approver_scope(user)
    if scope is not None:
        found = found.filter(requester__groups__in=scope).distinct()
    return found


def visible(user):
    """The requests ``user`` may read: their own, those they may decide, and (administrators,
    auditors, approvers) the decided ones of their scope."""
    mine = ApprovalRequest.objects.filter(requester=user)
    if access.can(user, "see_all"):
        return ApprovalRequest.objects.all()
    if not (access.is_admin(user) or access.can(user, "approve")):
        return mine
    scope = access.approver_scope(user)
    if scope is None:
        return ApprovalRequest.objects.all()
    theirs = ApprovalRequest.objects.filter(requester__groups__in=scope).values("pk")
    return ApprovalRequest.objects.filter(Q(pk__in=mine.values("pk")) | Q(pk__in=theirs))


def approve(request, *, actor, reason="", now=None):
    """Approve: what was asked is made now, as an unapproved request would have been. Returns the
    request: ``approved`` (``made_id`` set), or ``failed`` with why when it cannot be made now
    (no room any more, over a quota): the requester is told either way."""
    return _decide(request, A.APPROVED, reason, actor=actor, now=now)


def deny(request, *, actor, reason, now=None):
    """Deny with a reason (required: the requester is told it). Nothing was held, nothing is."""
    if not str(reason or "").strip():
        raise ValidationError({"reason": ["say why it is denied (the requester is told)"]})
    return _decide(request, A.DENIED, reason, actor=actor, now=now)


def withdraw(request, *, actor, now=None):
    """The requester takes back a request still waiting."""
    user = getattr(actor, "user", actor)
    if getattr(user, "pk", None) != request.requester_id:
        raise PermissionDenied("only the requester withdraws a request")
    return _close(request, A.WITHDRAWN, "withdrawn by the requester", actor=Actor.of(actor), now=now)


def _decide(request, outcome, reason, *, actor, now=None):
    actor = Actor.of(actor)
    now = now or timezone.now()
    if not may_decide(actor.user, request):
        raise PermissionDenied(
            "you may not decide your own request"
            if actor.user is not None and actor.user.pk == request.requester_id
            else "only an approver of the requester's groups may decide this request"
        )
    reason = str(reason or "").strip()[:500]
    with transaction.atomic():
        request = _locked_pending(request)
        late = request.expires_at <= now  # the clock has not passed yet: expired now, and said so
        if late:
            _finish(request, A.EXPIRED, "nobody decided it in time", actor=EXPIRY_ACTOR, now=now)
    if late:
        raise Conflict(f"approval request {request.pk} expired at {request.expires_at:%Y-%m-%d %H:%M} UTC")
    with transaction.atomic():
        request = _locked_pending(request)
        if outcome == A.DENIED:
            return _finish(request, A.DENIED, reason, actor=actor, now=now)
        proceed = PROCEED.one(request.kind)
        try:
            with transaction.atomic():
                made = proceed(request, actor=actor)
        except (ValidationError, PermissionDenied) as exc:  # no room any more, a quota, a course left
            why = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
            return _finish(request, A.FAILED, f"approved, but it cannot be made now: {why}", actor=actor, now=now)
        request.made_id = made
        return _finish(request, A.APPROVED, reason, actor=actor, now=now)


def _close(request, outcome, reason, *, actor, now=None):
    with transaction.atomic():
        request = _locked_pending(request)
        return _finish(request, outcome, reason, actor=actor, now=now or timezone.now())


def _locked_pending(request):
    locked = ApprovalRequest.objects.select_for_update().select_related("requester", "image").get(pk=request.pk)
    if locked.status != A.PENDING:
        raise Conflict(f"approval request {locked.pk} is {locked.get_status_display()} already")
    return locked


def _finish(request, outcome, reason, *, actor, now):
    """Record the outcome (in the caller's transaction, the row locked) and tell the requester."""
    request.status, request.reason, request.decided_at = outcome, reason[:500], now
    request.decided_by = actor.user
    request.save(update_fields=["status", "reason", "decided_at", "decided_by", "made_id"])
    changelog.record(request, "update", actor, {"status": [A.PENDING, outcome]}, reason=reason or outcome)
    if outcome != A.WITHDRAWN:
        events.emit("approval.decided", _data(request), [topics.user_topic(request.requester_id)])
    return request


def expire_due(now=None):
    """Expire the pending requests nobody decided in time (their requesters are told); returns how
    many. One indexed query when none is due (every tick)."""
    now = now or timezone.now()
    done = 0
    for pk in ApprovalRequest.objects.filter(status=A.PENDING, expires_at__lte=now).values_list("pk", flat=True):
        try:
            _close(ApprovalRequest(pk=pk), A.EXPIRED, "nobody decided it in time", actor=EXPIRY_ACTOR, now=now)
        except Conflict:  # decided meanwhile
            continue
        done += 1
    return done


def _data(request):
    """An event's data: what mails and pages need, the request's parameters aside."""
    return {
        "id": request.pk,
        "kind": request.kind,
        "status": request.status,
        "summary": request.summary,
        "image": request.image.name,
        **({"images": request.payload.get("images", [])} if request.kind == K.ENVIRONMENT else {}),
        "requester": request.requester.get_username(),
        "reason": request.reason,
        "made": request.made_id,
        "expires": request.expires_at.isoformat(),
        **({"start": request.starts_at.isoformat()} if request.starts_at else {}),
        **({"end": request.ends_at.isoformat()} if request.ends_at else {}),
    }
