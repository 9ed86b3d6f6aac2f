from django import forms
from django.conf import settings
from django.utils import timezone

from accounts import access
from accounts.models import ApiToken
from core import localtime


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="read is always given",
    )
    expires = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        allowed = access.allowed_scopes(user)
        self.fields["expires"].help_text = f"Time zone {timezone.get_current_timezone_name()}."
        self.fields["scopes"].choices = [(s, s) for s in access.SCOPES if s in allowed and s != "read"]

    def clean_name(self):
        name = self.cleaned_data["name"]
        if ApiToken.objects.filter(user=self.user, name=name).exists():
            raise forms.ValidationError("You already have a token with this name.")
        return name

    def clean_expires(self):
        expires = self.cleaned_data.get("expires")
        if expires is not None and expires <= timezone.now():
            raise forms.ValidationError("Must be in the future.")
        return expires


class TimeZoneForm(forms.Form):
    time_zone = forms.ChoiceField(
        required=False,
        label="Time zone",
        help_text="Pages, forms and e-mails show and read times in it.",
    )

    def __init__(self, *args, browser_zone="", **kwargs):
        super().__init__(*args, **kwargs)
        fallback = browser_zone or settings.TIME_ZONE
        where = "your browser's" if browser_zone else "the site's"
        self.fields["time_zone"].choices = [
            ("", f"Not chosen: {where}, {fallback}"),
            *((name, name) for name in sorted(localtime.zone_names())),
        ]
