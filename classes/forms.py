"""The class form of the course page: sessions and exceptions are lines of text
(``Mon 10:00 90``, ``2027-04-05 Easter Monday``), read by ``classes.calendar``."""

from django import forms

from classes import calendar, services
from environments import services as environment_services
from provisioning import services as vms

DATE_INPUT = forms.DateInput(attrs={"type": "date"})


class ClassForm(forms.Form):
    name = forms.CharField(max_length=100)
    image = forms.ModelChoiceField(queryset=None, help_text="Built from its production revision before each session.")
    environment = forms.ModelChoiceField(
        queryset=None,
        required=False,
        help_text="Each seat is this environment's machines (the image is its entry machine's). Blank: one VM.",
    )
    time_zone = forms.CharField(max_length=64, help_text="IANA name (Europe/Berlin): sessions keep their local hour.")
    first_day = forms.DateField(widget=DATE_INPUT)
    last_day = forms.DateField(widget=DATE_INPUT)
    sessions = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "Mon 10:00 90\nThu 14:00 120"}),
        help_text="One a line: weekday, local start, minutes.",
    )
    exceptions = forms.CharField(
        required=False,
        label="No session on",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "2027-04-05 Easter Monday"}),
        help_text="One a line: a date and why.",
    )
    seats = forms.IntegerField(required=False, min_value=1, help_text="Blank: one per member of the course.")
    lead_minutes = forms.IntegerField(min_value=0, max_value=24 * 60, initial=15, label="Build ahead (minutes)")
    vcpus = forms.IntegerField(required=False, min_value=1, label="CPUs", help_text="Blank: the image's default.")
    memory_mib = forms.IntegerField(required=False, min_value=16, label="Memory (MiB)", help_text="Blank: the default.")
    gpus = forms.IntegerField(min_value=0, initial=0, label="GPUs")
    hours_budget = forms.DecimalField(
        required=False,
        min_value=0,
        max_digits=7,
        decimal_places=2,
        label="Hours outside sessions",
        help_text="Each student's hours of the image in the term outside the sessions. Blank: no limit; 0: none.",
    )
    requires_approval = forms.BooleanField(
        required=False, help_text="The class waits for an approver before its sessions are claimed."
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["image"].queryset = vms.visible_images(user).order_by("name")
        self.fields["environment"].queryset = environment_services.visible_templates(user).filter(active=True)
        self.fields["time_zone"].initial = services.default_zone(user)

    def clean_sessions(self):
        try:
            return calendar.parse_sessions(self.cleaned_data["sessions"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_exceptions(self):
        try:
            return calendar.parse_exceptions(self.cleaned_data["exceptions"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    @staticmethod
    def initial_of(klass):
        """The form's values for an existing class."""
        days = calendar.WEEKDAYS
        sessions = "\n".join(f"{days[s.weekday]} {s.start:%H:%M} {s.minutes}" for s in klass.sessions.all())
        exceptions = "\n".join(f"{e.day.isoformat()} {e.reason}".strip() for e in klass.exceptions.all())
        values = {f: getattr(klass, f) for f in (*services.FIELDS, "gpus", "requires_approval", "environment")}
        return {**values, "sessions": sessions, "exceptions": exceptions}


class GrantForm(forms.Form):
    """Extra hours of a class's budget for one student (the course page's budget table)."""

    student = forms.ModelChoiceField(queryset=None, to_field_name="username")
    hours = forms.DecimalField(max_digits=7, decimal_places=2, help_text="Negative: taken back.")
    reason = forms.CharField(max_length=200)

    def __init__(self, *args, students, **kwargs):
        super().__init__(*args, **kwargs)
        field = self.fields["student"]
        field.queryset = students  # (``classes.budget.students``)
        field.label_from_instance = lambda user: user.get_username()


def add_service_errors(form, exc):
    for field, errors in exc.message_dict.items():
        form.add_error(field if field in form.fields else None, errors)
