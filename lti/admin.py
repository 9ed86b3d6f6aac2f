"""The LTI pages of the admin: platforms through ``lti.services`` (django-lti's own admin page
would show and take the per-registration private key, which vclmgr never uses), the tool's keys
read-only (public facts and a rotate action), and the course links."""

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.forms import CharField, ModelForm, Textarea, URLField
from lti_tool.models import Key, LtiRegistration

from lti import services
from lti.models import LtiCourse

admin.site.unregister(LtiRegistration)


class PlatformForm(ModelForm):
    deployment_ids = CharField(widget=Textarea(attrs={"rows": 3}), help_text="one deployment id per line")
    keyset_url = URLField(assume_scheme="https", label="key set URL (JWKS)")
    auth_url = URLField(assume_scheme="https", label="auth login URL")
    token_url = URLField(assume_scheme="https", label="access token URL")

    class Meta:
        model = LtiRegistration
        fields = [f for f in services.PLATFORM_FIELDS]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["deployment_ids"] = "\n".join(services.active_deployment_ids(self.instance))

    def clean_deployment_ids(self):
        lines = [line.strip() for line in self.cleaned_data["deployment_ids"].splitlines() if line.strip()]
        try:
            return services.deployment_ids_of(lines)  # the service's own check, as the field's error
        except ValidationError as exc:
            raise ValidationError(exc.message_dict["deployment_ids"]) from None


@admin.register(LtiRegistration)
class PlatformAdmin(admin.ModelAdmin):
    form = PlatformForm
    list_display = ["name", "issuer", "client_id", "is_active", "datetime_created"]
    readonly_fields = ["uuid"]

    def save_model(self, request, obj, form, change):
        fields = {name: form.cleaned_data[name] for name in services.PLATFORM_FIELDS if name in form.cleaned_data}
        ids = form.cleaned_data["deployment_ids"]
        # The form checked what the services check (fields, uniqueness, deployment ids).
        if change:
            services.update_platform(
                LtiRegistration.objects.get(pk=obj.pk), actor=request.user, deployment_ids=ids, **fields
            )
        else:
            obj.pk = services.add_platform(actor=request.user, deployment_ids=ids, **fields).pk

    def delete_model(self, request, obj):
        services.remove_platform(obj, actor=request.user)


@admin.register(Key)
class KeyAdmin(admin.ModelAdmin):
    list_display = ["__str__", "is_active", "datetime_created"]
    fields = ["is_active", "datetime_created"]
    readonly_fields = ["is_active", "datetime_created"]
    actions = ["rotate"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.action(description="Rotate: a new signing key; retire keys past LTI_KEY_RETIRE_DAYS")
    def rotate(self, request, queryset):
        kid, retired = services.rotate_keys(actor=request.user)
        self.message_user(request, f"New key {kid}; retired {len(retired)}.")


@admin.register(LtiCourse)
class LtiCourseAdmin(admin.ModelAdmin):
    list_display = ["group", "title", "registration", "context_id", "roster_synced"]
    readonly_fields = ["registration", "context_id", "group", "memberships_url", "created", "roster_synced"]
