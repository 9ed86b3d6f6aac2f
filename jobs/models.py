"""Job rows: the job itself, its dependencies, its log, the queue's tunables (and a test gauge).

Writes go through ``jobs.services`` (verbs) and ``jobs.transitions``
(status changes made by the dispatcher and the runner).
"""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import IntegrityError, connections, models, transaction
from django.db.models.functions import Greatest
from django.db.models.sql import UpdateQuery
from django.db.transaction import TransactionManagementError
from django.utils import timezone


def update_returning(queryset, fields, **values):
    """``queryset.update(**values)`` in one ``UPDATE … RETURNING`` statement: the updated rows.

    Returns model instances with ``fields`` (and the pk) loaded, as they are after the
    update. SQLite ≥ 3.35 and PostgreSQL support it; it saves the read after a conditional
    UPDATE on the job system's hot path.
    """
    if not connections[queryset.db].features.can_return_rows_from_bulk_insert:
        # SQLite < 3.35 has no RETURNING: update, then read back (callers update one row
        # under the queue lock, so nothing changes in between).
        ids = list(queryset.values_list("pk", flat=True))
        if not ids or not queryset.filter(pk__in=ids).update(**values):
            return []
        return list(queryset.model.objects.filter(pk__in=ids).only(*fields))
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(values)
    sql, params = query.get_compiler(queryset.db).as_sql()
    return _instances(queryset.model, queryset.db, ["id", *fields], sql + " RETURNING {columns}", params)


_loaders = {}


def _instances(model, alias, names, sql, params):
    """Run ``sql`` (``{columns}`` stands for the columns of ``names``) and load model instances.

    What ``raw()`` does, with the per-column converters worked out once per process: on the
    hot path ``raw()``'s own bookkeeping cost more than the statement.
    """
    connection = connections[alias]
    key = (model, alias, connection.vendor, tuple(names))
    loader = _loaders.get(key)
    if loader is None:
        wanted = {model._meta.get_field(name) for name in names}
        fields = [field for field in model._meta.concrete_fields if field in wanted]  # from_db's order
        converters = []
        for field in fields:
            column = field.get_col(model._meta.db_table)
            found = connection.ops.get_db_converters(column) + field.get_db_converters(connection)
            converters.append((column, found))
        columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
        loader = _loaders[key] = (columns, [field.attname for field in fields], converters)
    columns, attnames, converters = loader
    with connection.cursor() as cursor:
        cursor.execute(sql.format(columns=columns), params)
        rows = cursor.fetchall()
    instances = []
    for row in rows:
        values = []
        for value, (column, found) in zip(row, converters, strict=True):
            for converter in found:
                value = converter(value, column, connection)
            values.append(value)
        instances.append(model.from_db(alias, attnames, values))
    return instances


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

    # Lines users do not see (tracebacks name code paths, hosts and parameters).
    STAFF_ONLY_LEVELS = (Level.DEBUG,)

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
        connection = connections[cls.objects.db]
        if not connection.in_atomic_block:
            raise TransactionManagementError("QueueSettings.lock() outside a transaction")
        # Once per status change: the statement is written out (the ORM's compilation of
        # select_for_update() cost more than the query).
        table, pk = connection.ops.quote_name(cls._meta.db_table), connection.ops.quote_name("id")
        sql = f"SELECT {{columns}} FROM {table} WHERE {pk} = %s"
        if connection.features.has_select_for_update:
            sql += " FOR UPDATE"
        names = [field.name for field in cls._meta.concrete_fields]
        rows = _instances(cls, cls.objects.db, names, sql, [1])
        return rows[0] if rows else cls.objects.select_for_update().get(pk=cls.get().pk)


class Gauge(models.Model):
    """How many ``test.sleep`` steps run at once under a name, and the most there ever were.

    Tests and benchmarks read ``peak`` to check a concurrency limit where the workers run:
    each step counts itself in with one UPDATE that raises ``peak`` too, so no breach slips
    between two samples. The row must exist before the jobs run.
    """

    name = models.CharField(max_length=100, unique=True)
    value = models.IntegerField(default=0)
    peak = models.IntegerField(default=0)

    def __str__(self):
        return f"gauge {self.name}: {self.value} (peak {self.peak})"

    @classmethod
    def enter(cls, name):
        inside = models.F("value") + 1
        if not cls.objects.filter(name=name).update(value=inside, peak=Greatest("peak", inside)):
            raise cls.DoesNotExist(f"no gauge {name!r}")

    @classmethod
    def leave(cls, name):
        cls.objects.filter(name=name).update(value=models.F("value") - 1)
