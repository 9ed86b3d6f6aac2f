"""Forms of the self-service pages. They parse input; ``reservations.services`` validates and writes.

A service's ``ValidationError`` names the fields ``image``, ``start``, ``end`` (and ``name``,
``group``, ``seats``, ``weeks``, ``block``); ``add_service_errors`` puts each message under the
form field the user filled in (``end`` is the reserve form's ``duration``).
"""

import uuid
from datetime import timedelta

from django import forms
from django.utils import timezone

from environments.services import visible_templates
from provisioning import quotas
from provisioning import services as vms
from reservations import services
from reservations.models import MAX_GPUS

DURATIONS = (30, 60, 90, 120, 180, 240, 360, 480, 720, 1440)  # minutes offered, up to the user's limit
EXTENSIONS = (15, 30, 60, 120, 240)
SSH_KEY_TYPES = ("ssh-", "ecdsa-", "sk-ssh-", "sk-ecdsa-")
DATETIME_INPUT = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


def duration_choices(limit):
    offered = [m for m in DURATIONS if m <= limit]
    if limit not in offered:
        offered.append(limit)
    return [(m, quotas.human_minutes(m)) for m in offered]


def as_input(moment):
    """A datetime as the value of a minute-precision ``datetime-local`` input, rounded up (an
    earliest fit at 14:30:20 must not become 14:30, which would not fit)."""
    local = timezone.localtime(moment)
    if local.second or local.microsecond:
        local = local.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return local.strftime("%Y-%m-%dT%H:%M")


def add_service_errors(form, exc, rename=None):
    for field, errors in exc.message_dict.items():
        field = (rename or {}).get(field, field)
        form.add_error(field if field in form.fields else None, errors)


class WindowForm(forms.Form):
    """When, for how long and how to log in: what every reserve form asks."""

    when = forms.ChoiceField(choices=[("now", "now"), ("later", "later")], initial="now", widget=forms.RadioSelect)
    start = forms.DateTimeField(required=False, widget=DATETIME_INPUT, label="Start (for later)")
    duration = forms.TypedChoiceField(coerce=int, label="Duration")
    ssh_key = forms.CharField(
        required=False,
        max_length=4000,
        label="SSH public key (optional)",
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "ssh-ed25519 AAAA… you@laptop"}),
        help_text="Log in with your key instead of a one-time password.",
    )
    request_key = forms.UUIDField(widget=forms.HiddenInput)

    def __init__(self, *args, user, image=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["start"].help_text = f"Time zone {timezone.get_current_timezone_name()}"
        self.limits = self._limits(user, image)
        self.fields["duration"].choices = duration_choices(self.limits.max_minutes)
        self.fields[
            "duration"
        ].help_text = f"At most {quotas.human_minutes(self.limits.max_minutes)} ({self.limits.max_minutes_rule})."
        if not self.is_bound and "request_key" not in self.initial:
            self.initial["request_key"] = uuid.uuid4()

    def _limits(self, user, image):
        return quotas.limits_for(user, image)

    def clean_ssh_key(self):
        key = " ".join(self.cleaned_data["ssh_key"].split())
        if key and (not key.startswith(SSH_KEY_TYPES) or len(key.split(" ")) < 2):
            raise forms.ValidationError("an OpenSSH public key: type, key and optional comment on one line")
        return key

    def clean(self):
        data = super().clean()
        if data.get("when") == "later" and not data.get("start"):
            self.add_error("start", "give a start, or choose now")
        return data

    def window(self):
        """(start or None for now, duration) from a valid form."""
        data = self.cleaned_data
        start = data["start"] if data["when"] == "later" else None
        return start, timedelta(minutes=data["duration"])

    def add_service_errors(self, exc):
        add_service_errors(self, exc, {"end": "duration"})


class ReserveForm(WindowForm):
    image = forms.ModelChoiceField(queryset=None, empty_label=None)
    # Blank: the image's defaults (``reserving.gpu_ask``).
    gpus = forms.IntegerField(required=False, min_value=0, max_value=MAX_GPUS, label="GPUs")
    gpu_model = forms.CharField(required=False, max_length=100, label="GPU model")

    field_order = ["image", "when", "start", "duration", "ssh_key", "request_key", "gpus", "gpu_model"]

    def __init__(self, *args, user, **kwargs):
        images = vms.visible_images(user).order_by("name")
        chosen = self._chosen_image(images, kwargs.get("data") or (args[0] if args else None), kwargs.get("initial"))
        super().__init__(*args, user=user, image=chosen, **kwargs)
        self.fields["image"].queryset = images
        self.gpu_default = gpu_default(chosen)

    @staticmethod
    def _chosen_image(queryset, data, initial):
        """The image the duration limit is for: the submitted one if valid, else the first."""
        raw = data.get("image") if data is not None else (initial or {}).get("image")
        raw = getattr(raw, "pk", raw)
        image = queryset.filter(pk=raw).first() if str(raw or "").isdigit() else None
        return image or queryset.first()

    def gpu_ask(self):
        """``gpus`` and ``gpu_model`` for the services from a valid form (None: the image's)."""
        data = self.cleaned_data
        return {"gpus": data.get("gpus"), "gpu_model": data.get("gpu_model") or None}


class EnvironmentReserveForm(WindowForm):
    """Reserve an environment template (its page): every machine, now or later."""

    def __init__(self, *args, user, template, **kwargs):
        self.template = template
        super().__init__(*args, user=user, image=template.members.filter(entry=True).first().image, **kwargs)

    def _limits(self, user, image):
        """The strictest duration limit of its machines' images (each binds the reservation)."""
        images = {m.image for m in self.template.members.select_related("image")}
        limits = [quotas.limits_for(user, image), *(quotas.limits_for(user, other) for other in images - {image})]
        return min(limits, key=lambda found: found.max_minutes)  # (the entry's on a tie)


def gpu_default(image):
    """What blank GPU fields ask for with ``image``, in words."""
    if image is None or not image.default_gpus:
        return "none"
    return f"{image.default_gpus} × {image.default_gpu_model or 'any model'}"


class ExtendForm(forms.Form):
    minutes = forms.TypedChoiceField(
        coerce=int, label="Extend by", choices=[(m, quotas.human_minutes(m)) for m in EXTENSIONS]
    )


class BlockForm(forms.Form):
    name = forms.CharField(max_length=100)
    image = forms.ModelChoiceField(queryset=None, required=False, help_text="Blank with an environment: its entry's.")
    environment = forms.ModelChoiceField(
        queryset=None, required=False, help_text="Each seat is every machine of this environment template."
    )
    group = forms.ModelChoiceField(queryset=None, help_text="The class: its members get the seats.")
    seats = forms.IntegerField(min_value=1, max_value=1000)
    start = forms.DateTimeField(widget=DATETIME_INPUT, help_text="Of the first occurrence.")
    end = forms.DateTimeField(widget=DATETIME_INPUT, help_text="Of the first occurrence.")
    weeks = forms.IntegerField(min_value=1, max_value=52, initial=1, help_text="Occurrences, one a week.")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["image"].queryset = vms.visible_images(user).order_by("name")
        self.fields["environment"].queryset = visible_templates(user).filter(active=True).order_by("name")
        zone = timezone.get_current_timezone_name()
        self.fields["start"].help_text = f"Of the first occurrence; the weeks keep its local hour. Time zone {zone}"
        self.fields["end"].help_text = f"Of the first occurrence. Time zone {zone}."
        groups = services.teaching_groups(user)
        self.fields["group"].queryset = groups.order_by("name")

    def clean(self):
        data = super().clean()
        if data.get("image") is None and data.get("environment") is None and "image" not in self.errors:
            self.add_error("image", "give an image or an environment")
        return data
