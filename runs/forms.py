"""The run form of the runs page. It parses input; ``runs.services.submit`` validates and writes
(its ``ValidationError`` names ``platform``, ``command``, ``artifacts``, ``time_limit`` …, put
under the form's fields)."""

import shlex

from django import forms
from django.utils.text import slugify

from provisioning import services as vms


def platform_choices(user):
    seen = {}
    for image in vms.visible_images(user).filter(active=True).exclude(os=""):
        seen.setdefault(f"{slugify(image.os)}/{image.platform}", f"{image.os} ({image.platform})")
    return sorted(seen.items())


class RunForm(forms.Form):
    platform = forms.ChoiceField()
    command = forms.CharField(max_length=4000, help_text="As you would type it: make test", initial="make test")
    time_limit = forms.IntegerField(min_value=1, initial=10, help_text="minutes")
    artifacts = forms.CharField(required=False, max_length=1000, help_text="Patterns, space-separated: out/*.xml")
    keep_failed_minutes = forms.IntegerField(
        min_value=0,
        initial=0,
        required=False,
        label="Keep a failed VM",
        help_text="minutes its VM is kept stopped for inspection if it fails (0: destroyed at once)",
    )
    capture_failed = forms.BooleanField(required=False, label="Capture a failed VM as my image")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["platform"].choices = platform_choices(user)

    def clean_command(self):
        try:
            return shlex.split(self.cleaned_data["command"])
        except ValueError as exc:
            raise forms.ValidationError(f"cannot split the command: {exc}") from None

    def submit_kwargs(self):
        data = self.cleaned_data
        return {
            "platform": data["platform"],
            "argv": data["command"],
            "time_limit": data["time_limit"] * 60,
            "artifacts": data["artifacts"].split(),
            "keep_failed_minutes": data["keep_failed_minutes"] or 0,
            "capture_failed": data["capture_failed"],
        }


FIELD_OF = {"command": "command", "platform": "platform", "artifacts": "artifacts", "time_limit": "time_limit",
            "keep_failed_minutes": "keep_failed_minutes", "capture_failed": "capture_failed"}  # fmt: skip


def add_service_errors(form, exc):
    for field, messages in exc.message_dict.items():
        for message in messages:
            form.add_error(FIELD_OF.get(field), message)
