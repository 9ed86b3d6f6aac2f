"""Notifications (e-mail to users), the kinds each user turned off, webhooks and their deliveries.

``Notification`` and ``WebhookDelivery`` are written in the transaction of the event they
follow (``notifications.services``) and sent after commit by ``notifications.tasks``; both
share the delivery state machine of ``Delivery``.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from inventory import crypto

KINDS = [
    ("ready", "reservation ready"),
    ("ending", "reservation ending soon"),
    ("ended", "reservation ended"),
    ("failed", "reservation failed"),
    ("moved", "future reservation moved by maintenance"),
    ("endangered", "future reservation endangered by maintenance"),
    ("run_finished", "run finished"),
    ("idle_warning", "reservation idle: about to be reclaimed"),
    ("host_lost", "reservation's host lost: being rebuilt"),
    ("approval_request", "a request waits for your approval (approvers)"),
    ("approval_decided", "your request was approved, denied or expired"),
]
KIND_NAMES = [name for name, _ in KINDS]


class Delivery(models.Model):
    """One thing to send, tried until sent or given up (``attempts`` reaches the limit)."""

    class State(models.TextChoices):
        QUEUED = "queued", "queued"
        SENDING = "sending", "sending"
        RETRY = "retry", "retry"
        SENT = "sent", "sent"
        FAILED = "failed", "failed (given up)"
        SKIPPED = "skipped", "skipped"

    DUE = ("queued", "retry", "sending")  # sending: only once its lease (next_attempt) passed

    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt = models.DateTimeField(default=timezone.now)
    last_error = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class Notification(Delivery):
    """One e-mail to one user about one event; ``key`` ((event, user, kind)) makes it unique."""

    key = models.CharField(max_length=200, unique=True)
    # No database constraint, as for webhook deliveries: the row is inserted in the emitting
    # transaction, which a user deleted meanwhile must not fail (the sender skips the row).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications", db_constraint=False
    )
    kind = models.CharField(max_length=20, choices=KINDS)
    event_kind = models.CharField(max_length=100)
    data = models.JSONField(default=dict, blank=True)
    email = models.EmailField(blank=True, help_text="The address it went to.")
    subject = models.CharField(max_length=300, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state", "next_attempt"], name="notification_due")]
        ordering = ["-id"]

    def __str__(self):
        return f"{self.kind} to {self.user_id} ({self.state})"


class Preference(models.Model):
    """The notification kinds a user does not want (all are on by default)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_prefs")
    disabled = models.JSONField(default=list, blank=True)

    def __str__(self):
        return f"{self.user_id}: off {', '.join(self.disabled) or 'none'}"

    @classmethod
    def disabled_for(cls, user):
        """The kinds ``user`` turned off (the sender asks before each mail; pages show them)."""
        pref = cls.objects.filter(user=user).first()
        return list(pref.disabled) if pref else []


class Webhook(models.Model):
    """An integration's URL, called with a signed JSON body for each event of its kinds."""

    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=500)
    event_kinds = models.JSONField(default=list, help_text='Event kinds, e.g. ["reservation.changed"]; "*": all.')
    secret_token = models.TextField(blank=True, help_text="The signing secret, encrypted at rest.")
    active = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def set_secret(self, clear):
        self.secret_token = crypto.encrypt(clear)

    def get_secret(self):
        return crypto.decrypt(self.secret_token)


class WebhookDelivery(Delivery):
    """One POST of one event to one webhook, with what the last try answered."""

    # No database constraint: deliveries are inserted in the transaction of any event from each
    # process's cached list of webhooks; one deleted meanwhile must not fail that transaction
    # (the sender skips a delivery whose webhook is gone).
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries", db_constraint=False)
    event_kind = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state", "next_attempt"], name="webhookdelivery_due")]
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"

    def __str__(self):
        return f"{self.event_kind} → {self.webhook_id} ({self.state})"
