"""Batch runs: a command in a fresh VM of a platform, its output and its files.

A ``Run`` names a platform (an OS as images declare it, slugified: ``debian-12``, and an
architecture, ``Image.platform``) or an image; its VM is built, the command run through the
guest command channel, the output kept (``RunOutput`` chunks, bytes as printed, up to
``RUN_OUTPUT_MAX_BYTES``), the artifacts copied out (``RunFile``, through the ``runs``
storage), and the VM destroyed whatever the end. States follow the job model, plus
``suspended`` (its VM suspended to disk to make room for work of a higher class, resumed when
room returns: ``services.suspend_for``, ``services.resume_suspended``). ``reason`` is the
trail: ``[[source, message, when], …]``.
"""

from django.conf import settings
from django.db import models

ACTIVE = ("queued", "waiting", "running", "suspended")
FINAL = ("success", "error", "canceled")


class Run(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued", "queued"
        WAITING = "waiting", "waiting for its VM"
        RUNNING = "running", "running"
        SUSPENDED = "suspended", "suspended"
        SUCCESS = "success", "success (exit status 0)"
        ERROR = "error", "error"
        CANCELED = "canceled", "canceled"

    class Priority(models.TextChoices):
        LOW = "low", "low"
        BATCH = "batch", "batch"
        HIGH = "high", "high"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs")
    platform = models.CharField(max_length=100, blank=True, help_text="What was asked: os[/arch], or blank (an image).")
    image = models.ForeignKey("vms.Image", on_delete=models.PROTECT, related_name="runs")
    vm = models.ForeignKey("vms.VM", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    environment = models.ForeignKey(
        "environments.EnvironmentTemplate",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="runs",
        help_text="Run on its entry machine (vm), every machine of it built first (blank: one VM of the image).",
    )
    machines = models.ManyToManyField(
        "vms.VM", blank=True, related_name="+", help_text="An environment's other machines (its entry one is vm)."
    )
    counted_machines = models.JSONField(
        default=list,
        blank=True,
        help_text="An environment's machines as its quotas counted them at submit (environments.services.counted).",
    )
    vcpus = models.PositiveIntegerField()
    memory_mib = models.PositiveIntegerField()
    disk_gib = models.PositiveIntegerField()
    argv = models.JSONField(default=list, blank=True, help_text="The command as a list of words (or blank: script).")
    script = models.TextField(blank=True, help_text="A shell script, run with /bin/sh (or blank: argv).")
    env = models.JSONField(default=dict, blank=True)
    artifacts = models.JSONField(default=list, blank=True, help_text="Patterns under the work directory.")
    time_limit = models.PositiveIntegerField(help_text="Seconds the command may run.")
    priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.BATCH)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    exit_status = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    reason = models.JSONField(default=list, blank=True)
    job = models.PositiveBigIntegerField(null=True, blank=True, help_text="The run.execute job.")
    cancel_requested = models.BooleanField(default=False)
    suspend_requested = models.BooleanField(
        default=False, help_text="Work of a higher class took its CPU and memory: its job suspends its VM."
    )
    suspended_at = models.DateTimeField(null=True, blank=True, help_text="When it was last suspended.")
    suspended_seconds = models.FloatField(
        default=0, help_text="Time spent suspended (its time limit and its hold do not count it)."
    )
    output_seen = models.PositiveBigIntegerField(default=0, help_text="Bytes the command printed so far.")
    output_kept = models.PositiveBigIntegerField(default=0, help_text="Bytes kept (up to the limit).")
    output_chunks = models.PositiveIntegerField(default=0)
    hold_until = models.DateTimeField(
        help_text="The latest it can end (boot allowance + time limit): quotas count it until then."
    )
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True, help_text="When the command started.")
    ended = models.DateTimeField(null=True, blank=True)
    keep_failed_minutes = models.PositiveIntegerField(
        default=0, help_text="If it fails (an error after its command started), its VM is kept stopped this long."
    )
    capture_failed = models.BooleanField(
        default=False, help_text="If it fails, its VM is captured as an image of its owner's before it is destroyed."
    )
    kept_until = models.DateTimeField(null=True, blank=True, help_text="Its failed VM is kept (stopped) until then.")
    captured_image = models.ForeignKey(
        "vms.Image",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The image its failed VM was captured to.",
    )
    files_removed = models.DateTimeField(
        null=True, blank=True, help_text="When retention (RUNS_RETENTION_DAYS) removed its output and files."
    )

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["owner", "state"], name="run_owner_state")]

    def __str__(self):
        return f"run {self.pk}"

    @property
    def truncated(self):
        return self.output_seen > self.output_kept

    @property
    def is_final(self):
        return self.state in FINAL


class RunOutput(models.Model):
    """One piece of a run's output as it came (bytes: output need not be UTF-8)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="output")
    seq = models.PositiveIntegerField()
    offset = models.PositiveBigIntegerField(help_text="Where it starts in the output.")
    data = models.BinaryField()

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runoutput_unique_seq")]

    def __str__(self):
        return f"run {self.run_id} output {self.seq}"


class RunFile(models.Model):
    """An input file (put into the work directory before the command) or an artifact (copied
    out after it), stored through the ``runs`` storage under ``<run id>/<kind>/<path>``."""

    class Kind(models.TextChoices):
        INPUT = "input", "input"
        ARTIFACT = "artifact", "artifact"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="files")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    path = models.CharField(max_length=255, help_text="Relative to the work directory.")
    size = models.PositiveBigIntegerField(default=0)
    stored = models.CharField(max_length=500, help_text="Its name in the runs storage.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "kind", "path"]
        constraints = [models.UniqueConstraint(fields=["run", "kind", "path"], name="runfile_unique_path")]

    def __str__(self):
        return f"{self.kind} {self.path}"
