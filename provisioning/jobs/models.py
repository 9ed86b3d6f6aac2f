"""Job rows: the job itself, its dependencies, its log, and the queue's tunables.

Writes go through ``provisioning.jobs.services`` (verbs) and ``provisioning.jobs.transitions``
(status changes made by the dispatcher and the runner).
"""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import IntegrityError, models, transaction
from django.utils import timezone


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        WAITING = "waiting"
        RUNNING = "running"
        SUCCESS = "success"
        ERROR = "error"
        CANCELED = "canceled"

    FINAL = ("success", "error", "canceled")
    PENDING = ("queued", "waiting")
    MIN_PRIORITY, MAX_PRIORITY = -20, 20

    opcode = models.CharField(max_length=64, db_index=True)
    params = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    priority = models.SmallIntegerField(default=0, help_text="-20…20; higher runs first.")
    submitter = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    reason = models.JSONField(default=list, blank=True, help_text="Reason trail: [[source, reason, time], …]")
    buckets = models.JSONField(default=list, blank=True, help_text="Rate-limit buckets: [[reason, N], …]")
    locks = models.JSONField(default=list, blank=True, help_text='[[name, "shared"|"exclusive"], …]')
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    child_key = models.CharField(max_length=100, blank=True, help_text="Makes a parent's resubmission idempotent.")
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries")
    received = models.DateTimeField(default=timezone.now, db_index=True)
    started = models.DateTimeField(null=True, blank=True)
    ended = models.DateTimeField(null=True, blank=True)
    waiting_for = models.CharField(max_length=300, blank=True)
    awaiting_children = models.BooleanField(default=False)
    progress = models.JSONField(default=dict, blank=True, help_text='{"done": n, "total": m, "step": name}')
    steps = models.JSONField(default=list, blank=True, help_text='Completed steps: [{"name", "result", "ended"}]')
    result = models.JSONField(null=True, blank=True)
    error_message = models.TextField(blank=True)
    error_kind = models.CharField(max_length=20, blank=True)
    attempt = models.PositiveSmallIntegerField(default=0)
    lease_token = models.CharField(max_length=32, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    runner = models.CharField(max_length=120, blank=True, help_text="host:pid of the worker running it")
    cancel_requested = models.BooleanField(default=False)
    archived = models.BooleanField(default=False)
    # Shortcuts for the hot path: skip dependency queries for jobs that have none.
    has_deps = models.BooleanField(default=False, editable=False)
    has_dependents = models.BooleanField(default=False, editable=False)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["status", "-priority", "id"], name="job_dispatch"),
            models.Index(fields=["submitter", "-id"], name="job_submitter"),
            models.Index(fields=["status", "lease_until"], name="job_lease"),
            models.Index(fields=["archived", "ended"], name="job_archive"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["parent", "child_key"], condition=~models.Q(child_key=""), name="job_unique_child_key"
            ),
            models.CheckConstraint(condition=models.Q(priority__gte=-20, priority__lte=20), name="job_priority_range"),
        ]

    def __str__(self):
        return f"job {self.pk} {self.opcode} ({self.status})"

    @property
    def is_final(self):
        return self.status in self.FINAL

    @property
    def is_pending(self):
        return self.status in self.PENDING

    @property
    def depends(self):
        """Ganeti's form: ``[[job_id, [statuses]], …]``."""
        return [[d.on_id, list(d.accepted)] for d in self.dependencies.all()]


class JobDependency(models.Model):
    """``job`` starts only after ``on`` ended in one of ``accepted`` (empty: any final status)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies")
    on = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependents")
    accepted = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["job", "on"], name="jobdependency_unique")]

    def __str__(self):
        return f"job {self.job_id} after job {self.on_id} {self.accepted or 'any'}"


class JobLog(models.Model):
    class Level(models.TextChoices):
        DEBUG = "debug"
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_entries")
    time = models.DateTimeField(default=timezone.now)
    level = models.CharField(max_length=10, choices=Level.choices, default=Level.INFO)
    message = models.TextField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "id"], name="joblog_job")]

    def __str__(self):
        return f"{self.time:%H:%M:%S} {self.level} {self.message[:60]}"


def _bounds(bounds):
    return [MinValueValidator(bounds[0]), MaxValueValidator(bounds[1])]


class QueueSettings(models.Model):
    """The queue's run-time tunables: one row, read at every claim (no restart needed)."""

    LIMIT_RANGE = (1, 10000)
    LEASE_RANGE = (2, 3600)
    ATTEMPTS_RANGE = (1, 20)

    limit = models.PositiveIntegerField(
        default=20, validators=_bounds(LIMIT_RANGE), help_text="At most this many jobs run at once."
    )
    lease_seconds = models.PositiveIntegerField(
        default=30,
        validators=_bounds(LEASE_RANGE),
        help_text="A running job whose worker stops renewing its lease this long is recovered.",
    )
    max_attempts = models.PositiveSmallIntegerField(
        default=3, validators=_bounds(ATTEMPTS_RANGE), help_text="Attempts per job (a lost worker costs one)."
    )
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "queue settings"

    def __str__(self):
        return f"queue: limit {self.limit}, lease {self.lease_seconds}s, {self.max_attempts} attempts"

    @classmethod
    def get(cls):
        row = cls.objects.filter(pk=1).first()
        if row is None:
            try:
                with transaction.atomic():
                    row = cls.objects.create(pk=1)
            except IntegrityError:  # created by someone else meanwhile
                row = cls.objects.get(pk=1)
        return row

    @classmethod
    def lock(cls):
        """The row, locked until the end of the transaction: serializes every status change.

        PostgreSQL takes a row lock; SQLite ignores FOR UPDATE, but there every write
        transaction is IMMEDIATE (settings), which already serializes them.
        """
        row = cls.objects.select_for_update().filter(pk=1).first()
        return row or cls.objects.select_for_update().get(pk=cls.get().pk)
