"""Forms of the image library and VM pages. They parse input; the services validate and write."""

from django import forms
from django.contrib.auth.models import Group
from django.db.models import Q

from accounts import access
from drivers.base import IMAGE_NAME_RE
from provisioning import services
from provisioning.models import Image, ImageVariant


class ImageFilterForm(forms.Form):
    q = forms.CharField(label="Search", required=False, max_length=100)
    os = forms.ChoiceField(label="OS", required=False)
    platform = forms.ChoiceField(required=False)

    def __init__(self, *args, images, **kwargs):
        super().__init__(*args, **kwargs)
        for field in ("os", "platform"):
            values = images.exclude(**{field: ""}).order_by(field).values_list(field, flat=True).distinct()
            self.fields[field].choices = [("", "any")] + [(v, v) for v in values]

    def filter(self, images):
        if not self.is_valid():
            return images
        data = self.cleaned_data
        if data["q"]:
            q = data["q"]
            images = images.filter(Q(name__icontains=q) | Q(os__icontains=q) | Q(description__icontains=q))
        for field in ("os", "platform"):
            if data[field]:
                images = images.filter(**{field: data[field]})
        return images


class TagsField(forms.CharField):
    """Host tag names typed comma-separated; the service checks and normalises them."""

    def __init__(self, **kwargs):
        kwargs.pop("encoder", None), kwargs.pop("decoder", None)  # a JSONField's own form field options
        super().__init__(max_length=2000, required=False, **kwargs)

    def prepare_value(self, value):
        return ", ".join(value) if isinstance(value, (list, tuple)) else value

    def to_python(self, value):
        return [name.strip() for name in (value or "").split(",") if name.strip()]


class ImageTagsMixin(forms.ModelForm):
    required_tags = TagsField(help_text=Image._meta.get_field("required_tags").help_text + " Comma-separated.")
    forbidden_tags = TagsField(help_text=Image._meta.get_field("forbidden_tags").help_text + " Comma-separated.")

    def clean(self):
        data = super().clean()
        visibility = data.get("visibility", self.instance.visibility)
        refusal = services.pool_refusal(visibility, data.get("pool_size", self.instance.pool_size))
        if refusal:
            self.add_error("pool_size" if "pool_size" in self.fields else None, refusal)
        return data


class ImageForm(ImageTagsMixin, forms.ModelForm):
    groups = forms.ModelMultipleChoiceField(queryset=Group.objects.order_by("name"), required=False)

    class Meta:
        model = Image
        fields = [*services.IMAGE_FIELDS, "groups"]
        widgets = {"description": forms.Textarea(attrs={"rows": 3}), "user_data": forms.Textarea(attrs={"rows": 4})}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["ready_timeout"].required = False  # blank: the model's default
        self.fields["readiness"].required = False
        self.fields["on_host_failure"].required = False
        self.fields["pool_size"].required = False  # blank: no pool
        self.fields["warm_min"].required = False  # blank: no warm pool
        self.fields["warm_max"].required = False
        self.fields["default_gpus"].required = False  # blank: none
        parents = Image.objects.order_by("name")
        if self.instance.pk:
            parents = parents.exclude(pk=self.instance.pk)
        self.fields["parent"].queryset = parents

    def service_fields(self):
        """(fields, groups) for ``services.create_image`` / ``update_image``."""
        data = dict(self.cleaned_data)
        if data.get("ready_timeout") is None:
            data["ready_timeout"] = Image._meta.get_field("ready_timeout").default
        data["readiness"] = data.get("readiness") or Image.Readiness.PORT
        data["on_host_failure"] = data.get("on_host_failure") or "rebuild"
        data["pool_size"] = data.get("pool_size") or 0
        data["warm_min"] = data.get("warm_min") or 0
        data["warm_max"] = data.get("warm_max") or 0
        data["default_gpus"] = data.get("default_gpus") or 0
        return {name: data[name] for name in services.IMAGE_FIELDS}, data["groups"]


def guest_password_field(help_text):
    """A variant's guest password: written, never shown back (the field is always empty)."""
    return forms.CharField(
        required=False, strip=False, max_length=200, widget=forms.PasswordInput(render_value=False), help_text=help_text
    )


class VariantForm(forms.ModelForm):
    guest_password = guest_password_field("VMware: the guest user's password (stored encrypted; never shown again).")

    class Meta:
        model = ImageVariant
        fields = list(services.VARIANT_FIELDS)


class RevisionForm(VariantForm):
    """A new revision with one disk (more are added through the API or ``manage.py revision``)."""

    comment = forms.CharField(required=False, max_length=2000, help_text="What changed, for whoever rolls back.")


class ActionForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a) for a in (*services.ACTIONS, "snapshot", "revert")])
    name = forms.CharField(max_length=100, required=False)

    def clean(self):
        data = super().clean()
        if data.get("action") in ("snapshot", "revert"):
            if not IMAGE_NAME_RE.match(data.get("name") or ""):
                self.add_error("name", "a snapshot name: letters, digits, . _ - only")
        return data


class ResizeForm(forms.Form):
    vcpus = forms.IntegerField(min_value=1, max_value=4096, required=False)
    memory_mib = forms.IntegerField(min_value=16, max_value=1 << 30, required=False, label="Memory (MiB)")


class CaptureForm(forms.Form):
    """Capture a VM as a new image (the VM and reservation pages)."""

    image_name = forms.RegexField(
        IMAGE_NAME_RE, max_length=100, label="New image name", help_text="Letters, digits, '.', '_' and '-'."
    )
    comment = forms.CharField(max_length=1000, required=False, help_text="What is in it, or what changed (optional).")
    next = forms.CharField(max_length=2000, required=False, widget=forms.HiddenInput)


class RenameForm(forms.Form):
    name = forms.RegexField(IMAGE_NAME_RE, max_length=100, help_text="Letters, digits, '.', '_' and '-'.")


class ShareForm(forms.Form):
    """The groups an image is shared with, among those ``user`` may give (``maintained_groups``)."""

    groups = forms.ModelMultipleChoiceField(
        queryset=Group.objects.none(), required=False, widget=forms.CheckboxSelectMultiple
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["groups"].queryset = access.shareable_groups(user).order_by("name")
