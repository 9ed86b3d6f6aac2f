"""Reservations: a user's claim on an image for a window, the class blocks that make many, and quotas.

A ``Reservation`` holds a capacity ``Allocation`` for its whole window from the moment it is
accepted (so a future reservation is as sure as one for now), gets a ``VM`` built on that claim
ahead of its start, and ends at its end. Its status history is ``ReservationHistory``.
A ``BlockAllocation`` is an instructor's N seats of an image for a user group over a window,
repeated weekly if asked; each occurrence becomes N seat reservations that members take.
Quotas (``QuotaRule``) live with the VMs, below this app, so that reservations and ad-hoc VMs
are limited by one engine (``provisioning.quotas``).
"""

from datetime import timedelta

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from inventory import crypto
from provisioning.models import MAX_GPUS


class Reservation(models.Model):
    class Status(models.TextChoices):
        REQUESTED = "requested", "requested"
        PENDING = "pending", "pending"
        PLACING = "placing", "placing"
        PROVISIONING = "provisioning", "provisioning"
        READY = "ready", "ready"
        ENDING = "ending", "ending"
        ENDED = "ended", "ended"
        FAILED = "failed", "failed"
        CANCELED = "canceled", "canceled"

    # Statuses that count against quotas and hold capacity.
    ACTIVE = ("requested", "pending", "placing", "provisioning", "ready")
    FINAL = ("ended", "failed", "canceled")

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="reservations",
        help_text="Blank: an untaken seat of a block allocation.",
    )
    image = models.ForeignKey("vms.Image", on_delete=models.PROTECT, related_name="reservations")
    start = models.DateTimeField()
    end = models.DateTimeField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.REQUESTED)
    vcpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    memory_mib = models.PositiveIntegerField(validators=[MinValueValidator(16)])
    disk_gib = models.PositiveIntegerField()
    gpus = models.PositiveSmallIntegerField(
        default=0, validators=[MaxValueValidator(MAX_GPUS)], help_text="GPUs of one model the VM gets."
    )
    gpu_model = models.CharField(max_length=100, blank=True, help_text="Blank: whichever model a host has.")
    allocation = models.ForeignKey(
        "capacity.Allocation", null=True, blank=True, on_delete=models.SET_NULL, related_name="reservations"
    )
    vm = models.ForeignKey("vms.VM", null=True, blank=True, on_delete=models.SET_NULL, related_name="reservations")
    block = models.ForeignKey(
        "BlockAllocation", null=True, blank=True, on_delete=models.CASCADE, related_name="seat_reservations"
    )
    occurrence = models.PositiveIntegerField(default=0, help_text="Which week of a recurring block.")
    # An image's template (``reservations.templates``): its maintainers' long-lived VM, published
    # as the image's next revision. ``revision``: the one its VM is built from (a template's
    # start, or a revision under test); None: the production revision when it is built.
    template_of = models.ForeignKey(
        "vms.Image",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="templates",
        help_text="The image this reservation is the template of (its maintainers publish it as a revision).",
    )
    revision = models.ForeignKey(
        "vms.ImageRevision",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="reservations",
        help_text="The revision its VM is built from; blank: the production one.",
    )
    environment = models.ForeignKey(
        "environments.EnvironmentTemplate",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="reservations",
        help_text="The environment template it is a machine of (blank: one image, one VM).",
    )
    head = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="members",
        help_text="An environment's machine: the reservation of its entry machine, which acts for all.",
    )
    hostname = models.CharField(max_length=63, blank=True, help_text="An environment machine's hostname.")
    attempts = models.PositiveSmallIntegerField(default=0, help_text="VM builds tried (a failed one is retried once).")
    failed_hosts = models.JSONField(default=list, blank=True)
    connect_user = models.CharField(max_length=64, blank=True)
    connect_secret = models.TextField(blank=True, help_text="One-time password, encrypted at rest.")
    ssh_key = models.TextField(blank=True, help_text="A public key to log in with instead of a password.")
    request_key = models.CharField(max_length=64, blank=True, help_text="The form's one-time key (double submits).")
    warned = models.BooleanField(default=False, help_text="The end-of-reservation warning was sent.")
    error = models.TextField(blank=True)
    degraded = models.CharField(
        max_length=500,
        blank=True,
        help_text="Why its claim stays on a host taken out of service (no other host had room); blank: fine.",
    )
    # Idle reclamation (``reservations.idle``): the idle clock runs from ``idle_since`` (ready,
    # then the last activity seen); ``idle_check_at`` is when the guest is asked next (None: no
    # policy applies, never asked).
    idle_since = models.DateTimeField(null=True, blank=True)
    connected_at = models.DateTimeField(null=True, blank=True, help_text="When a login was first seen in the guest.")
    idle_warned_at = models.DateTimeField(null=True, blank=True)
    idle_check_at = models.DateTimeField(null=True, blank=True)
    idle_deadline = models.DateTimeField(null=True, blank=True, help_text="Reclaimed then unless someone logs in.")
    idle_kind = models.CharField(max_length=10, blank=True, help_text="What the deadline is for: no_show or idle.")
    reclaimed = models.CharField(
        max_length=10,
        blank=True,
        choices=[("no_show", "no-show"), ("idle", "idle")],
        help_text="Ended early by idle reclamation, and why.",
    )
    reclaimed_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-start", "-id"]
        indexes = [
            models.Index(fields=["status", "idle_check_at"], name="reservation_idle_due"),
            models.Index(fields=["reclaimed_at"], name="reservation_reclaimed"),
            models.Index(fields=["status", "start"], name="reservation_status_start"),
            models.Index(fields=["status", "end"], name="reservation_status_end"),
            models.Index(fields=["user", "status"], name="reservation_user_status"),
            models.Index(fields=["end"], name="reservation_end"),  # usage: what was held on a day
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "request_key"], condition=~models.Q(request_key=""), name="reservation_request_once"
            ),
            models.CheckConstraint(condition=models.Q(end__gt=models.F("start")), name="reservation_end_after_start"),
            models.UniqueConstraint(
                fields=["template_of"],
                condition=models.Q(status__in=("requested", "pending", "placing", "provisioning", "ready", "ending")),
                name="reservation_one_open_template",
            ),
        ]

    def __str__(self):
        return f"reservation {self.pk}"

    def gpu_ask(self):
        """Its GPUs as ``provisioning.services.demand_for`` takes them (every claim of it asks them)."""
        return {"gpus": self.gpus, "gpu_model": self.gpu_model}

    @property
    def active(self):
        return self.status in self.ACTIVE

    @property
    def duration(self):
        return self.end - self.start

    def set_password(self, clear):
        self.connect_secret = crypto.encrypt(clear) if clear else ""

    def get_password(self):
        return crypto.decrypt(self.connect_secret) if self.connect_secret else ""


class IdlePolicy(models.Model):
    """When an image's or a group's ready reservations are reclaimed (``reservations.idle``).

    Exactly one of ``image`` / ``group``. The image's policy wins over the group's; the group
    is the reservation's usage group (its block's, else its user's first). 0 turns a limit off.
    """

    image = models.OneToOneField(
        "vms.Image", null=True, blank=True, on_delete=models.CASCADE, related_name="idle_policy"
    )
    group = models.OneToOneField(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="idle_policy"
    )
    no_show_minutes = models.PositiveIntegerField(
        default=15, help_text="Ended when nobody logged in within this many minutes of ready (0: never)."
    )
    idle_minutes = models.PositiveIntegerField(
        default=60, help_text="Ended after this many minutes without a login or input (0: never)."
    )
    warn_minutes = models.PositiveIntegerField(default=10, help_text="The idle warning comes this long before.")

    class Meta:
        verbose_name_plural = "idle policies"
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(image__isnull=False) & models.Q(group__isnull=True))
                | (models.Q(image__isnull=True) & models.Q(group__isnull=False)),
                name="idlepolicy_image_or_group",
            ),
        ]

    def __str__(self):
        return f"idle policy of {self.image or self.group}"


class ReservationHistory(models.Model):
    """One status change with its reason (what the user sees under 'what happened')."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="history")
    status = models.CharField(max_length=12, choices=Reservation.Status.choices)
    reason = models.CharField(max_length=500, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
        verbose_name_plural = "reservation history"

    def __str__(self):
        return f"{self.reservation} {self.status} at {self.at:%Y-%m-%d %H:%M}"


class BlockAllocation(models.Model):
    """N seats of an image for a user group over a window (VCL's block reservations)."""

    name = models.CharField(max_length=100)
    image = models.ForeignKey("vms.Image", on_delete=models.PROTECT, related_name="blocks")
    environment = models.ForeignKey(
        "environments.EnvironmentTemplate",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="blocks",
        help_text="Each seat is this environment (image: its entry machine's); blank: one VM of the image.",
    )
    group = models.ForeignKey("auth.Group", on_delete=models.PROTECT, related_name="blocks")
    seats = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(1000)])
    start = models.DateTimeField(help_text="Start of the first occurrence.")
    end = models.DateTimeField(help_text="End of the first occurrence.")
    weeks = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(52)], help_text="Occurrences, one a week."
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    canceled = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-start", "-id"]

    def __str__(self):
        return self.name


class UsageDay(models.Model):
    """One UTC day of reservation use for one image and group (``reservations.usage`` fills it).

    Additive figures only, so any filter sums rows. The group of a reservation is its block's
    group, else its user's first group (lowest id) that gives no role, else "" (no group). Names, not keys: a
    deleted image or group keeps its history.
    """

    day = models.DateField()
    image = models.CharField(max_length=100)
    group = models.CharField(max_length=150, blank=True)
    seconds = models.BigIntegerField(default=0, help_text="Seconds a ready machine was held, clipped to the day.")
    reservations = models.PositiveIntegerField(default=0, help_text="Reservations whose use started that day.")
    ready_count = models.PositiveIntegerField(default=0, help_text="Reservations that became ready that day.")
    ready_seconds = models.BigIntegerField(default=0, help_text="Their summed waits from wanted to ready.")

    class Meta:
        ordering = ["day", "image", "group"]
        constraints = [models.UniqueConstraint(fields=["day", "image", "group"], name="usage_day_once")]

    def __str__(self):
        return f"{self.day} {self.image} {self.group or '-'}"


class UsageRollup(models.Model):
    """One UTC day (or month) of one user's use of one image, as one kind, in one group and class
    (``reservations.showback`` fills it with the day's ``UsageDay`` rows, in one transaction).

    Every kind of use: a reservation, a class's seat (a reservation of a class session's
    block), a batch run, an ad-hoc VM. Additive figures only, so any grouping sums rows.
    Names beside keys: a deleted user, image, group or class keeps its history (``class_id``
    is a plain number: classes live above this app).
    """

    class Kind(models.TextChoices):
        RESERVATION = "reservation", "reservation"
        CLASS = "class", "class seat"
        RUN = "run", "batch run"
        VM = "vm", "ad-hoc VM"

    class Span(models.TextChoices):
        DAY = "day", "day"
        MONTH = "month", "month (the sum of its days)"
        MARK = "mark", "mark (the day is stored; no figures)"

    # A month row (``day``: the 1st) sums the month's day rows, so that a year's report reads
    # twelve months' rows rather than 365 days'; it is rebuilt whenever one of its days is stored.
    # A mark row says its day is stored (days stored before showback existed have none: they
    # are computed live until ``usage_backfill`` stores them again).
    span = models.CharField(max_length=5, choices=Span.choices, default=Span.DAY)
    day = models.DateField()
    kind = models.CharField(max_length=12, choices=Kind.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    username = models.CharField(max_length=150, blank=True)
    image = models.CharField(max_length=100)
    group = models.CharField(max_length=150, blank=True)
    class_id = models.PositiveBigIntegerField(null=True, blank=True)
    class_name = models.CharField(max_length=100, blank=True)
    seconds = models.BigIntegerField(default=0, help_text="Seconds held, clipped to the day.")
    vcpu_seconds = models.BigIntegerField(default=0)
    mib_seconds = models.BigIntegerField(default=0, help_text="Memory held, MiB × seconds.")
    gpu_seconds = models.BigIntegerField(default=0)
    uses = models.PositiveIntegerField(default=0, help_text="Uses that started that day.")

    class Meta:
        ordering = ["day", "kind", "username"]
        indexes = [
            models.Index(fields=["span", "day"], name="usage_rollup_day"),
            models.Index(fields=["user", "day"], name="usage_rollup_user"),
            models.Index(fields=["class_id", "day"], name="usage_rollup_class"),
        ]

    def __str__(self):
        return f"{self.day} {self.kind} {self.username or '-'} {self.image}"


class UsagePeak(models.Model):
    """The most machines held at once on one UTC day; ``image`` / ``group`` None: any."""

    day = models.DateField()
    image = models.CharField(max_length=100, null=True, blank=True)
    group = models.CharField(max_length=150, null=True, blank=True)
    peak = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["day"]
        indexes = [models.Index(fields=["day", "image", "group"], name="usage_peak_day")]

    def __str__(self):
        return f"{self.day} peak {self.peak}"


class Refusal(models.Model):
    """A reservation refused (for want of capacity, over a quota, a full class): what the usage
    report counts by reason."""

    at = models.DateTimeField(db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    image = models.CharField(max_length=100)
    group = models.CharField(max_length=150, blank=True)
    reason = models.CharField(max_length=64, help_text="The code most hosts were refused for.")
    reasons = models.JSONField(default=dict, blank=True, help_text="Hosts refused per reason code.")

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self):
        return f"refusal {self.reason} at {self.at:%Y-%m-%d %H:%M}"


class ApprovalRequest(models.Model):
    """A request that waits for an approver (``reservations.approvals``): a reservation of an
    image, or of an environment with a machine of such an image, or a class, that requires
    approval. Nothing is claimed while it waits: ``payload`` keeps what was asked, and an
    approval makes it then, exactly as an unapproved request would have been (``made_id``: the
    reservation, an environment's head, or class it made)."""

    class Kind(models.TextChoices):
        RESERVATION = "reservation", "reservation"
        ENVIRONMENT = "environment", "environment"
        CLASS = "class", "class"

    class Status(models.TextChoices):
        PENDING = "pending", "waiting for approval"
        APPROVED = "approved", "approved"
        DENIED = "denied", "denied"
        EXPIRED = "expired", "expired"
        FAILED = "failed", "approved, but could not be made"
        WITHDRAWN = "withdrawn", "withdrawn"

    kind = models.CharField(max_length=12, choices=Kind.choices)
    requester = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="approval_requests")
    image = models.ForeignKey("vms.Image", on_delete=models.CASCADE, related_name="approval_requests")
    summary = models.CharField(max_length=300, help_text="What is asked, in words.")
    payload = models.JSONField(default=dict, help_text="The request's parameters, as they were given.")
    request_key = models.CharField(max_length=64, blank=True, help_text="The form's one-time key (double submits).")
    starts_at = models.DateTimeField(null=True, blank=True, help_text="When it would start (None: when approved).")
    expires_at = models.DateTimeField(help_text="Expired unless decided by then.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    reason = models.CharField(max_length=500, blank=True, help_text="The approver's reason, or why it failed.")
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    made_id = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The reservation (an environment's head) or class it made."
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["status", "expires_at"], name="approval_due")]
        constraints = [
            models.UniqueConstraint(
                fields=["requester", "request_key"], condition=~models.Q(request_key=""), name="approval_request_once"
            ),
        ]

    def __str__(self):
        return f"approval request {self.pk} ({self.kind})"

    @property
    def pending(self):
        return self.status == self.Status.PENDING

    @property
    def ends_at(self):
        """When a reservation asked for a start would end (None: a class, or when approved)."""
        if (
            self.kind not in (self.Kind.RESERVATION, self.Kind.ENVIRONMENT)
            or self.starts_at is None
            or "seconds" not in self.payload
        ):
            return None
        return self.starts_at + timedelta(seconds=self.payload["seconds"])
