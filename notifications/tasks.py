"""Sending what ``notifications.services`` queued: mails and webhook deliveries.

A delivery is claimed by a conditional UPDATE (due → ``sending`` with a lease in
``next_attempt``), so two workers never send the same one; a worker that died mid-send
leaves a lease that expires and the delivery is tried again. A failed try waits
``NOTIFY_RETRY_SECONDS`` × 2^(tries−1), and after ``NOTIFY_MAX_ATTEMPTS`` tries the delivery
is ``failed`` with its last error (admin pages show it) and a log line. A sent mail carries a
Message-ID made from its key, so even a send repeated after a crash at the worst moment is
recognisably one message.

Who sends: ``kick`` (on commit of the event) queues a django-q2 task for promptness; a
daemon thread in every worker (``start_sender``) sends whatever is due every
``NOTIFY_POLL_SECONDS`` (retries, and anything a lost task left) and queues the
"ending soon" mails (``queue_ending``).

The task runs on the workers that run jobs, so a slow receiver must not hold a job slot:
one ``send_due`` sends for at most ``NOTIFY_SEND_BUDGET_SECONDS`` and queues itself again for
the rest; a webhook try begins only if its whole time limit (``WEBHOOK_TIMEOUT_SECONDS``,
connect to answer, not per read) fits in what is left.

A webhook is posted through ``core.outbound``: a URL on a loopback, link-local or private
address (unless ``VCLMGR_OUTBOUND_ALLOW`` names it) is refused before any connection, no
redirect is followed, and every failed try reads ``delivery failed`` in the delivery log,
with no status or duration; the detail goes to the server's log.
"""

import hashlib
import hmac
import json
import logging
import time
from datetime import timedelta

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db.models import Q
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from accounts import preferences
from core import metrics, outbound, periodic
from notifications.models import Delivery, Notification, Preference, Webhook, WebhookDelivery

log = logging.getLogger(__name__)
LEASE = timedelta(seconds=120)
S = Delivery.State


def kick():
    """After commit: have a worker send what is due now (the daemon would, a little later)."""
    from django_q.tasks import async_task

    try:
        # Not saved on success (as the job tasks): django-q2 would prune its success table
        # under a lock that reads every saved row, once per mail kicked.
        async_task("notifications.tasks.send_due", save=False, q_options={"timeout": 60})
    except Exception:  # the broker down: the workers' daemon sends it on its next round
        log.warning("could not queue the notification task; the sender will pick it up", exc_info=True)


def send_due(limit=100, requeue=True):
    """Send the due mails and webhook deliveries (up to ``limit`` of each) for at most
    ``NOTIFY_SEND_BUDGET_SECONDS``; returns counts. What the budget left is queued again as a
    new task (``requeue``; the workers' sender daemon, which runs again anyway, does not)."""
    deadline = time.monotonic() + settings.NOTIFY_SEND_BUDGET_SECONDS
    done, left = {"mail": 0, "webhook": 0}, False
    # A mail try is bounded per SMTP operation (EMAIL_TIMEOUT) only: it begins while time is left.
    channels = (
        (Notification, _send_mail, "mail", 0),
        (WebhookDelivery, _post_webhook, "webhook", settings.WEBHOOK_TIMEOUT_SECONDS),
    )
    for model, send, name, try_seconds in channels:
        for pk in _due(model, limit):
            if time.monotonic() + try_seconds > deadline:
                left = True
                break
            row = _claim(model, pk)
            if row is not None:
                _attempt(row, send, name)
                done[name] += 1
    if left and requeue:
        kick()
    return done


def _due(model, limit):
    now = timezone.now()
    due = Q(state__in=(S.QUEUED, S.RETRY)) | Q(state=S.SENDING)
    return list(
        model.objects.filter(due, next_attempt__lte=now)
        .order_by("next_attempt", "pk")
        .values_list("pk", flat=True)[:limit]
    )


def _claim(model, pk):
    """The row, now ours to send (``sending`` under a lease), or None if another took it."""
    now = timezone.now()
    row = model.objects.filter(pk=pk).first()
    if row is None or row.state not in Delivery.DUE or row.next_attempt > now:
        return None
    taken = model.objects.filter(pk=pk, state=row.state, attempts=row.attempts, next_attempt=row.next_attempt).update(
        state=S.SENDING, attempts=row.attempts + 1, next_attempt=now + LEASE
    )
    if not taken:
        return None
    row.state, row.attempts = S.SENDING, row.attempts + 1
    return row


def _attempt(row, send, name):
    model = type(row)
    try:
        outcome = send(row) or {}
    except Exception as exc:  # each failure is recorded on the row; the next try may work
        error = str(exc) if isinstance(exc, WebhookFailed) else f"{type(exc).__name__}: {exc}"[:2000]
        extra = getattr(exc, "fields", {})
        if row.attempts >= settings.NOTIFY_MAX_ATTEMPTS:
            log.warning("%s %s given up after %s tries: %s", name, row.pk, row.attempts, error)
            model.objects.filter(pk=row.pk, state=S.SENDING).update(
                state=S.FAILED, last_error=error, finished=timezone.now(), **extra
            )
            metrics.DELIVERIES.labels(channel=name, outcome="failed").inc()
            return
        delay = settings.NOTIFY_RETRY_SECONDS * 2 ** (row.attempts - 1)
        model.objects.filter(pk=row.pk, state=S.SENDING).update(
            state=S.RETRY, last_error=error, next_attempt=timezone.now() + timedelta(seconds=delay), **extra
        )
        metrics.DELIVERIES.labels(channel=name, outcome="retry").inc()
        return
    state = outcome.pop("state", S.SENT)
    model.objects.filter(pk=row.pk, state=S.SENDING).update(state=state, finished=timezone.now(), **outcome)
    metrics.DELIVERIES.labels(channel=name, outcome=state).inc()


# --- mail ---------------------------------------------------------------------------------


#: The event data's times (ISO 8601 strings), given to the templates as datetimes in ``when``.
MOMENTS = ("start", "end", "at", "since", "expires")


def _moments(data):
    when = {}
    for name in MOMENTS:
        moment = parse_datetime(data[name]) if isinstance(data.get(name), str) else None
        if moment is not None and timezone.is_aware(moment):
            when[name] = moment
    return when


def _context(row):
    from reservations.models import Reservation

    data = row.data or {}
    reservation = None
    if row.event_kind.startswith("reservation.") and data.get("id"):
        reservation = Reservation.objects.select_related("image", "vm").filter(pk=data["id"]).first()
    return {"user": row.user, "data": data, "when": _moments(data), "reservation": reservation, "kind": row.kind}


def _send_mail(row):
    user = type(row).user.field.related_model.objects.filter(pk=row.user_id).first()
    if user is None:
        return {"state": S.SKIPPED, "last_error": "the user was deleted"}
    row.user = user
    if row.kind in Preference.disabled_for(user):
        return {"state": S.SKIPPED, "last_error": "turned off in the user's preferences"}
    if not user.email or not user.is_active:
        return {"state": S.SKIPPED, "last_error": "the user has no e-mail address" if user.is_active else "inactive"}
    context = _context(row)
    with timezone.override(preferences.zone_of(user)):  # the recipient's times, not the worker's
        subject = " ".join(render_to_string(f"notifications/{row.kind}_subject.txt", context).split())[:300]
        body = render_to_string(f"notifications/{row.kind}_body.txt", context)
    digest = hashlib.sha256(row.key.encode()).hexdigest()[:32]
    message = EmailMessage(
        subject,
        body,
        settings.DEFAULT_FROM_EMAIL,
        [user.email],
        headers={"Message-ID": f"<{digest}@vclmgr>", "X-Vclmgr-Notification": row.kind},
        connection=get_connection(timeout=settings.EMAIL_TIMEOUT),
    )
    message.send()
    return {"email": user.email, "subject": subject, "last_error": ""}


# --- webhooks -------------------------------------------------------------------------------


class WebhookFailed(Exception):
    def __init__(self, message, **fields):
        super().__init__(message)
        self.fields = fields


def signature(secret, timestamp, body):
    """``sha256=<hex>`` of ``timestamp + "." + body``: the timestamp is signed with the body, so a
    receiver that refuses old timestamps cannot be fed a captured delivery again (a replay)."""
    signed = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def _post_webhook(row):
    hook = Webhook.objects.filter(pk=row.webhook_id).first()
    if hook is None:
        return {"state": S.SKIPPED, "last_error": "the webhook was deleted"}
    if not hook.active:
        return {"state": S.SKIPPED, "last_error": "the webhook was deactivated"}
    body = json.dumps(
        {"id": row.pk, "kind": row.event_kind, "time": row.created.isoformat(), "data": row.payload.get("data", {})},
        sort_keys=True,
    ).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "vclmgr-webhook",
        "X-Vclmgr-Event": row.event_kind,
        "X-Vclmgr-Delivery": str(row.pk),
        "X-Vclmgr-Timestamp": timestamp,
        "X-Vclmgr-Signature": signature(hook.get_secret(), timestamp, body),
    }
    began = time.monotonic()
    try:
        status = outbound.post(hook.url, body, headers, timeout=settings.WEBHOOK_TIMEOUT_SECONDS)
        detail = None if 200 <= status < 300 else f"HTTP {status}"
    except outbound.OutboundError as exc:
        detail = str(exc)
    if detail:
        # The detail (refused, closed, silent, which status) is for the server's log: the delivery
        # log, which a webhook's owner reads, says the same for all, or it would map the network.
        log.info("webhook %s delivery %s to %s: %s", hook.pk, row.pk, hook.url, detail)
        raise WebhookFailed(outbound.PUBLIC_ERROR, status_code=None, duration_ms=None)
    return {"status_code": status, "duration_ms": int((time.monotonic() - began) * 1000), "last_error": ""}


# --- "ending soon", and the worker daemon -------------------------------------------------


def queue_ending(now=None):
    """Queue an "ending soon" mail for each ready reservation ending within NOTIFY_ENDING_MINUTES
    (once per end time: an extended reservation is told again about its new end)."""
    from reservations.models import Reservation

    minutes = settings.NOTIFY_ENDING_MINUTES
    if minutes <= 0:
        return 0
    now = now or timezone.now()
    due = Reservation.objects.filter(
        status="ready", user__isnull=False, end__gt=now, end__lte=now + timedelta(minutes=minutes), head__isnull=True
    ).only("pk", "end", "user_id")  # an environment's machines: told once, of its head
    rows = [
        Notification(
            key=f"reservation.{r.pk}.end.{r.end.isoformat()}:user.{r.user_id}:ending",
            user_id=r.user_id,
            kind="ending",
            event_kind="reservation.ending",
            data={"id": r.pk, "end": r.end.isoformat(), "minutes": max(1, round((r.end - now).total_seconds() / 60))},
        )
        for r in due
    ]
    known = set(Notification.objects.filter(key__in=[row.key for row in rows]).values_list("key", flat=True))
    rows = [row for row in rows if row.key not in known]
    Notification.objects.bulk_create(rows, ignore_conflicts=True)  # sent by the same round, just after
    return len(rows)


def sender_round():
    queue_ending()
    send_due(requeue=False)  # this daemon's next round takes the rest


def start_sender(**kwargs):
    """django-q2 ``post_spawn`` receiver: one sender thread per worker process."""
    return periodic.start_daemon("notifications-sender", sender_round, lambda: settings.NOTIFY_POLL_SECONDS)
