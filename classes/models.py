"""Classes with a term: a course's weekly sessions of an image over a term, with holidays.

A ``Class`` belongs to a course group; its ``WeeklySession`` rows say when it meets each week
(local times in the class's ``time_zone``), its ``NoSessionDay`` rows the dates it does not
(holidays). A ``Meeting`` is one occurrence made real: the block allocation
(``reservations.BlockAllocation``, one week) whose seat reservations hold the session's claims
(``classes.services`` says why a block per occurrence). Outside its sessions a student may
reserve the class's image up to ``hours_budget`` hours in the term, plus the ``BudgetGrant``
rows an instructor gave them (``classes.budget``).
"""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from reservations.models import MAX_GPUS


class Class(models.Model):
    name = models.CharField(max_length=100)
    course = models.ForeignKey("auth.Group", on_delete=models.CASCADE, related_name="classes")
    image = models.ForeignKey(
        "vms.Image",
        on_delete=models.PROTECT,
        related_name="classes",
        help_text="Its VMs are built from the image's production revision when each session is built.",
    )
    environment = models.ForeignKey(
        "environments.EnvironmentTemplate",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="classes",
        help_text="Each seat is this environment's machines (image: its entry machine's); blank: one VM of the image.",
    )
    # The size, as a reservation's: blank is the image's default.
    vcpus = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    memory_mib = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(16)])
    gpus = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(MAX_GPUS)])
    gpu_model = models.CharField(max_length=100, blank=True)
    time_zone = models.CharField(max_length=64, help_text="IANA name; sessions keep their local hour in it.")
    first_day = models.DateField()
    last_day = models.DateField()
    seats = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seats of each session; blank: one per member of the course (capped)."
    )
    lead_minutes = models.PositiveIntegerField(default=15, help_text="Its VMs are built this long before a session.")
    hours_budget = models.DecimalField(
        max_digits=7,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Hours each student may reserve the image outside sessions in the term; blank: no limit, 0: none.",
    )
    requires_approval = models.BooleanField(
        default=False,
        help_text="Its creation waited for an approver (as every class of an image that requires approval does).",
    )
    problem = models.CharField(
        max_length=500, blank=True, help_text="Why the last session coming into the look-ahead could not be claimed."
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["first_day", "name", "id"]
        verbose_name_plural = "classes"
        constraints = [
            models.CheckConstraint(condition=models.Q(last_day__gte=models.F("first_day")), name="class_term_order"),
        ]

    def __str__(self):
        return self.name


class WeeklySession(models.Model):
    klass = models.ForeignKey(Class, on_delete=models.CASCADE, related_name="sessions")
    weekday = models.PositiveSmallIntegerField(validators=[MaxValueValidator(6)], help_text="0: Monday … 6: Sunday.")
    start = models.TimeField(help_text="Local time in the class's time zone.")
    minutes = models.PositiveIntegerField(validators=[MinValueValidator(5), MaxValueValidator(12 * 60)])

    class Meta:
        ordering = ["weekday", "start", "id"]

    def __str__(self):
        return f"{self.klass} {self.weekday} {self.start:%H:%M}"


class NoSessionDay(models.Model):
    """A date (local) the class does not meet: a holiday, an exam week's day."""

    klass = models.ForeignKey(Class, on_delete=models.CASCADE, related_name="exceptions")
    day = models.DateField()
    reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["day"]
        constraints = [models.UniqueConstraint(fields=["klass", "day"], name="class_exception_once")]

    def __str__(self):
        return f"{self.klass} no session on {self.day}"


class Meeting(models.Model):
    """One session occurrence made real: its block holds the seats' claims."""

    klass = models.ForeignKey(Class, on_delete=models.CASCADE, related_name="meetings")
    start = models.DateTimeField()
    end = models.DateTimeField()
    block = models.OneToOneField(
        "reservations.BlockAllocation", null=True, on_delete=models.SET_NULL, related_name="meeting"
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["start", "id"]
        constraints = [models.UniqueConstraint(fields=["klass", "start"], name="meeting_once")]

    def __str__(self):
        return f"{self.klass} at {self.start:%Y-%m-%d %H:%M}"


class BudgetGrant(models.Model):
    """Extra hours of a class's budget an instructor gave one student (negative: taken back)."""

    klass = models.ForeignKey(Class, on_delete=models.CASCADE, related_name="grants")
    student = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    hours = models.DecimalField(max_digits=7, decimal_places=2)
    reason = models.CharField(max_length=200)
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["klass", "student"], name="budgetgrant_class_student")]

    def __str__(self):
        return f"{self.hours} h for {self.student} in {self.klass}"
