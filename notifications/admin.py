from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from notifications import services
from notifications.models import Notification, Preference, Webhook, WebhookDelivery


class ReadOnly(admin.ModelAdmin):
    """Written by the services and the sender only: admins read here (and see the last error)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Notification)
class NotificationAdmin(ReadOnly):
    list_display = ["id", "created", "user", "kind", "state", "attempts", "email", "last_error"]
    list_filter = ["state", "kind"]
    search_fields = ["user__username", "email", "key"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnly):
    list_display = [
        "id",
        "created",
        "webhook",
        "event_kind",
        "state",
        "attempts",
        "status_code",
        "duration_ms",
        "last_error",
    ]
    list_filter = ["state", "webhook"]


class WebhookForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https")
    secret = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        required=False,
        min_length=16,
        strip=False,
        help_text="The HMAC-SHA256 signing key (at least 16 characters), stored encrypted. On change: blank keeps it.",
    )

    class Meta:
        model = Webhook
        fields = ["name", "url", "event_kinds", "active"]

    def clean(self):
        data = super().clean()
        if self.instance.pk is None and not data.get("secret"):
            self.add_error("secret", "required")
        if "url" in data and "event_kinds" in data:
            try:
                services.check_webhook(data["url"], data["event_kinds"])
            except ValidationError as exc:
                for field, messages in exc.message_dict.items():
                    self.add_error(field, messages)
        return data


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    """Admins configure webhooks here or through the API; both write through the services."""

    form = WebhookForm
    list_display = ["name", "url", "event_kinds", "active", "created"]

    def save_model(self, request, obj, form, change):
        fields = {name: form.cleaned_data[name] for name in ("name", "url", "event_kinds", "active")}
        secret = form.cleaned_data.get("secret") or None
        if change:
            saved = services.update_webhook(Webhook.objects.get(pk=obj.pk), actor=request.user, secret=secret, **fields)
        else:
            saved = services.create_webhook(actor=request.user, secret=secret, **fields)
        obj.pk, obj.secret_token = saved.pk, saved.secret_token

    def delete_model(self, request, obj):
        services.delete_webhook(obj, actor=request.user)

    def delete_queryset(self, request, queryset):
        for hook in queryset:
            services.delete_webhook(hook, actor=request.user)


@admin.register(Preference)
class PreferenceAdmin(ReadOnly):
    list_display = ["user", "disabled"]
