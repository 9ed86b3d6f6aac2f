"""What each event means for users' mail and for webhooks; preferences; webhook settings.

The one place notifications come from is the event outbox (``core.events``): ``on_event``
listens to the kinds in ``RULES`` and ``on_any_event`` to every kind a webhook wants
(``NotificationsConfig.ready`` registers both), inside the transaction that emits the event.
Each writes rows only (one INSERT); rendering and sending happen after commit in
``notifications.tasks``, so a broken template or a dead SMTP server never fails the action that emitted the event.

A rule turns an event into ``(kind, key)``: the notification kind and the identity of the
thing it tells (a reservation's VM being ready, its failure…). Recipients are the users whose
``user.<id>`` topic the event went to. The row's unique key is (key, user, kind): an event
told twice (an extension re-announces "ready", a re-run job degrades again) mails once.
The rules are this app's own table: every kind it mails about is one below it.
"""

import hashlib
import threading
import time

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from core import changelog, outbound
from core.changelog import Actor
from notifications.models import KIND_NAMES, Notification, Preference, Webhook, WebhookDelivery

# --- rules: event -> (notification kind, identity of what it tells) ----------------------


def _reservation_changed(data, event_id):
    status, rid = data.get("status"), data.get("id")
    if status == "ready":
        return "ready", f"reservation.{rid}.vm.{data.get('vm')}"
    if status in ("failed", "ended"):
        return status, f"reservation.{rid}"
    return None


def _digest(text):
    return hashlib.sha256(str(text).encode()).hexdigest()[:16]


RULES = {
    "reservation.changed": _reservation_changed,
    "reservation.degraded": lambda data, _id: (
        "endangered",
        f"reservation.{data.get('id')}.{_digest(data.get('reason'))}",
    ),
    "reservation.moved": lambda data, _id: (
        "moved",
        f"reservation.{data.get('id')}.allocation.{data.get('allocation')}",
    ),
    # Each idle spell warned once (activity resets the clock: a later spell is another mail).
    "reservation.idle": lambda data, _id: ("idle_warning", f"reservation.{data.get('id')}.idle.{data.get('since')}"),
    # Rebuilding elsewhere; a loss that fails the reservation is told by its "failed" mail.
    "reservation.host_lost": lambda data, _id: (
        ("host_lost", f"reservation.{data.get('id')}.lost.{_digest(data.get('host'))}.{_id}")
        if data.get("outcome") == "rebuilding"
        else None
    ),
    # A request waiting for approval, to its approvers' topics; its outcome, to the requester's.
    "approval.requested": lambda data, _id: ("approval_request", f"approval.{data.get('id')}"),
    "approval.decided": lambda data, _id: ("approval_decided", f"approval.{data.get('id')}.{data.get('status')}"),
    # A batch run's end (runs.services.set_state), to its owner's topic.
    "run.finished": lambda data, _id: ("run_finished", f"run.{data.get('id')}"),
}


def on_event(kind, data, topics, ids):
    rule = RULES.get(kind)
    told = rule(data, ids[0] if ids else None) if rule else None
    if told is None:
        return
    notify_kind, key = told
    rows = [
        Notification(
            key=f"{key}:{topic}:{notify_kind}"[:200],
            user_id=int(topic[5:]),
            kind=notify_kind,
            event_kind=kind,
            data=data,
        )
        for topic in topics
        if topic.startswith("user.") and topic[5:].isdigit()
    ]
    if rows:
        queue(rows)


def queue(rows):
    """Insert notifications (a key already there is left alone) and send them after commit."""
    Notification.objects.bulk_create(rows, ignore_conflicts=True)
    _kick_after_commit()


def _kick_after_commit():
    from notifications import tasks

    # One kick per transaction, however many events it told (Django keeps no set of callbacks).
    pending = getattr(transaction.get_connection(), "run_on_commit", [])
    if not any(len(entry) > 1 and entry[1] is tasks.kick for entry in pending):
        transaction.on_commit(tasks.kick)


# --- webhooks: every kind an active webhook wants -------------------------------------------

_cache = {"at": None, "hooks": ()}
_cache_lock = threading.Lock()


def _active_hooks():
    now = time.monotonic()
    with _cache_lock:
        if _cache["at"] is None or now - _cache["at"] >= settings.WEBHOOK_CACHE_SECONDS:
            _cache["hooks"] = tuple(Webhook.objects.filter(active=True).values_list("pk", "event_kinds"))
            _cache["at"] = now
        return _cache["hooks"]


def forget_hooks():
    """Read the webhooks again on the next event (this process; the others within the cache time)."""
    with _cache_lock:
        _cache["at"] = None


def on_any_event(kind, data, topics, ids):
    hooks = [pk for pk, kinds in _active_hooks() if kind in kinds or "*" in kinds]
    if not hooks:
        return
    WebhookDelivery.objects.bulk_create(
        [WebhookDelivery(webhook_id=pk, event_kind=kind, payload={"kind": kind, "data": data}) for pk in hooks]
    )
    _kick_after_commit()


# --- preferences ------------------------------------------------------------------------


def disabled_kinds(user):
    return Preference.disabled_for(user)


def set_preferences(user, disabled, *, actor):
    """Turn the given kinds off for ``user`` (and every other kind on)."""
    unknown = sorted(set(disabled) - set(KIND_NAMES))
    if unknown:
        raise ValidationError(
            {"disabled": [f"unknown kind {name!r} (kinds: {', '.join(KIND_NAMES)})" for name in unknown]}
        )
    with transaction.atomic():
        pref, _ = Preference.objects.select_for_update().get_or_create(user=user)
        old = sorted(pref.disabled)
        pref.disabled = sorted(set(disabled))
        pref.save(update_fields=["disabled"])
        if old != pref.disabled:
            changelog.record(
                pref, "update", Actor.of(actor), {"disabled": [old, pref.disabled]}, "notification preferences"
            )
    return pref


# --- webhooks (admins) --------------------------------------------------------------------


def check_webhook(url, event_kinds):
    errors = {}
    if not str(url).startswith(("http://", "https://")):
        errors["url"] = ["an http:// or https:// URL"]
    elif refused := outbound.refusal(url):  # a name is checked again, resolved, at each try
        errors["url"] = [f"not allowed: {refused} (VCLMGR_OUTBOUND_ALLOW names exceptions)"]
    if (
        not isinstance(event_kinds, list)
        or not event_kinds
        or not all(isinstance(k, str) and k and len(k) <= 100 for k in event_kinds)
    ):
        errors["event_kinds"] = ['a non-empty list of event kinds (e.g. "reservation.changed"), or ["*"]']
    if errors:
        raise ValidationError(errors)


def create_webhook(*, actor, name, url, event_kinds, secret, active=True):
    check_webhook(url, event_kinds)
    if not secret or len(secret) < 16:
        raise ValidationError({"secret": ["at least 16 characters"]})
    with transaction.atomic():
        hook = Webhook(name=name, url=url, event_kinds=event_kinds, active=active)
        hook.set_secret(secret)
        hook.full_clean()
        hook.save()
        changelog.record(hook, "create", Actor.of(actor), reason="webhook created")
    forget_hooks()
    return hook


def update_webhook(hook, *, actor, secret=None, **fields):
    check_webhook(fields.get("url", hook.url), fields.get("event_kinds", hook.event_kinds))
    if secret is not None and len(secret) < 16:
        raise ValidationError({"secret": ["at least 16 characters"]})
    with transaction.atomic():
        changes = {name: [getattr(hook, name), value] for name, value in fields.items() if getattr(hook, name) != value}
        for name, value in fields.items():
            setattr(hook, name, value)
        if secret is not None:
            hook.set_secret(secret)
            changes["secret"] = ["***", "***"]
        hook.full_clean()
        hook.save()
        changelog.record(hook, "update", Actor.of(actor), changes, "webhook changed")
    forget_hooks()
    return hook


def delete_webhook(hook, *, actor):
    with transaction.atomic():
        changelog.record(hook, "delete", Actor.of(actor), reason="webhook deleted")
        hook.delete()
    forget_hooks()
