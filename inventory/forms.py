"""Forms for the inventory pages and admin. They only shape input: the services validate."""

from django import forms
from django.contrib.admin.helpers import ActionForm
from import_export.forms import ImportForm

from core import outbound
from inventory import formats
from inventory.models import Credential, Hypervisor, NodeGroup
from inventory.resources import header_problem
from inventory.validators import FIRST_SLOT, HOST_MINIMUMS, MAX_SLOTS, RATIO_DEFAULTS, RATIO_MAX, RATIO_MIN

REASON_HELP = "Why: kept in the change log (e.g. 'firmware upgrade, ticket 4711')."


class StateForm(forms.Form):
    state = forms.ChoiceField(choices=Hypervisor.State.choices)
    reason = forms.CharField(max_length=500, help_text=REASON_HELP)


class ScheduleForm(forms.Form):
    state = forms.ChoiceField(choices=[("drained", "drained"), ("offline", "offline")])
    reason = forms.CharField(max_length=400, help_text=REASON_HELP)


class StateActionForm(ActionForm):
    """The admin's action bar, with the reason a state change needs."""

    reason = forms.CharField(max_length=500, required=False, help_text=REASON_HELP)


class CredentialAdminForm(forms.ModelForm):
    secret = forms.CharField(
        required=False,
        strip=False,
        max_length=4096,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Stored encrypted and never shown again. Leave blank to keep the current secret.",
    )
    clear_secret = forms.BooleanField(required=False, help_text="Remove the stored secret.")
    endpoints = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One URL a line: where the secret may be sent (a BMC's https://host:port, a vCenter's URL); "
        "nowhere else. Changing them needs the secret given again.",
    )

    class Meta:
        model = Credential
        fields = ["name", "username", "secret", "clear_secret", "endpoints", "description"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial["endpoints"] = "\n".join(self.instance.endpoints or [])

    def clean(self):
        # The service refuses the same; said here, it is a message on the form, not an error page.
        cleaned = super().clean()
        try:
            wanted = sorted({outbound.origin(url) for url in cleaned.get("endpoints", "").split()})
        except ValueError as exc:
            self.add_error("endpoints", str(exc))
            return cleaned
        if self.instance.pk and wanted != sorted(self.instance.endpoints) and not cleaned.get("secret"):
            self.add_error("endpoints", "give the secret again to change where it may be sent")
        return cleaned


class HypervisorImportForm(ImportForm):
    """The admin's import form, refusing a file for the same reasons the API and CLI do."""

    def __init__(self, import_formats, resources, **kwargs):
        super().__init__(import_formats, resources, **kwargs)
        self.import_formats = import_formats

    def clean(self):
        cleaned = super().clean()
        upload, index = cleaned.get("import_file"), cleaned.get("format")
        if upload is None or index in (None, ""):
            return cleaned
        try:
            formats.check_size(upload.size)
            data = upload.read()
            upload.seek(0)
            dataset = formats.load(data, self.import_formats[int(index)].name)
        except formats.FileError as exc:
            self.add_error("import_file", str(exc))
            return cleaned
        problem = header_problem(dataset.headers)
        if problem:
            self.add_error("import_file", problem)
        return cleaned


class BladeCenterRegistrationForm(forms.Form):
    """Register a chassis and one hypervisor per slot: the fields of the registration service."""

    name = forms.CharField(max_length=100, help_text="Chassis name, e.g. bc1.")
    site = forms.CharField(max_length=100, required=False)
    model = forms.CharField(max_length=100, required=False)
    slot_count = forms.IntegerField(min_value=FIRST_SLOT, max_value=MAX_SLOTS, initial=16)
    management_address = forms.CharField(max_length=253, required=False)
    bmc_address = forms.CharField(
        label="BMC address",
        max_length=500,
        required=False,
        help_text="The chassis' Redfish service (https://…), for host power; each blade's system is set per host.",
    )
    bmc_credential = forms.ModelChoiceField(
        Credential.objects.all(), required=False, to_field_name="name", label="BMC credential"
    )
    first_slot = forms.IntegerField(min_value=FIRST_SLOT, max_value=MAX_SLOTS, initial=FIRST_SLOT)
    last_slot = forms.IntegerField(min_value=FIRST_SLOT, max_value=MAX_SLOTS, initial=16)
    hostname_pattern = forms.CharField(
        max_length=100, initial="{chassis}-s{slot:02d}", help_text="Placeholders: {chassis} {slot} {index}."
    )
    first_address = forms.CharField(max_length=45, help_text="Address of the first host; the next ones follow.")
    driver = forms.ChoiceField(choices=Hypervisor.Driver.choices, initial="sim")
    uri_template = forms.CharField(
        label="URI template",
        max_length=500,
        required=False,
        help_text="e.g. qemu+ssh://root@{address}/system — "
        "placeholders {address} {name} {slot} {index} {chassis}; blank: derived from the driver.",
    )
    credential = forms.ModelChoiceField(Credential.objects.all(), required=False, to_field_name="name")
    group = forms.ModelChoiceField(NodeGroup.objects.all(), required=False, to_field_name="name", label="Node group")
    cpus = forms.IntegerField(label="CPUs", min_value=HOST_MINIMUMS["cpus"], help_text="Per host: physical cores.")
    memory_mib = forms.IntegerField(min_value=HOST_MINIMUMS["memory_mib"], label="Memory (MiB)")
    disk_gib = forms.IntegerField(min_value=HOST_MINIMUMS["disk_gib"], label="Disk (GiB)")
    cpu_ratio = forms.FloatField(
        label="CPU ratio", min_value=RATIO_MIN, max_value=RATIO_MAX, initial=RATIO_DEFAULTS["cpu_ratio"]
    )
    memory_ratio = forms.FloatField(min_value=RATIO_MIN, max_value=RATIO_MAX, initial=RATIO_DEFAULTS["memory_ratio"])
    disk_ratio = forms.FloatField(min_value=RATIO_MIN, max_value=RATIO_MAX, initial=RATIO_DEFAULTS["disk_ratio"])
    tags = forms.CharField(max_length=500, required=False, help_text="Comma-separated.")

    def spec(self):
        """The cleaned form as the service's registration spec."""
        spec = dict(self.cleaned_data)
        for key in ("credential", "group", "bmc_credential"):
            spec[key] = spec[key].name if spec.get(key) else None
        return spec
