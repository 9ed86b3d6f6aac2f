import json

from django import forms

from accounts import access
from jobs import registry
from jobs.models import Job, QueueSettings


class JobSubmitForm(forms.Form):
    opcode = forms.ChoiceField()
    params = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), required=False, initial="{}", help_text='JSON, e.g. {"steps": 3}'
    )
    reason = forms.CharField(max_length=1000, required=False, help_text="Why; rate-limit:N:label limits a bucket")
    priority = forms.IntegerField(initial=0, min_value=Job.MIN_PRIORITY, max_value=Job.MAX_PRIORITY)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["opcode"].choices = [
            (op.name, op.name) for op in registry.all_opcodes() if registry.may_submit(user, op.name)
        ]

    def clean_priority(self):
        priority = self.cleaned_data["priority"]
        if priority > 0 and not access.can(self.user, "operate"):
            raise forms.ValidationError("only operators may raise the priority above 0")
        return priority

    def clean_params(self):
        raw = self.cleaned_data["params"].strip() or "{}"
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not valid JSON: {exc.msg} (line {exc.lineno})") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("must be a JSON object")
        return value


class QueueForm(forms.Form):
    limit = forms.IntegerField(min_value=QueueSettings.LIMIT_RANGE[0], max_value=QueueSettings.LIMIT_RANGE[1])
    lease_seconds = forms.IntegerField(min_value=QueueSettings.LEASE_RANGE[0], max_value=QueueSettings.LEASE_RANGE[1])
    max_attempts = forms.IntegerField(
        min_value=QueueSettings.ATTEMPTS_RANGE[0], max_value=QueueSettings.ATTEMPTS_RANGE[1]
    )
    reason = forms.CharField(max_length=1000, required=False)


class JobActionForm(forms.Form):
    reason = forms.CharField(max_length=1000, required=False)
