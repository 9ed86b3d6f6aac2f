from rest_framework import serializers

from core.api.serializers import RefuseUnknownFields
from inventory.api.serializers import ServiceSerializer
from notifications import services
from notifications.models import KIND_NAMES, Notification, Webhook, WebhookDelivery


class PreferenceSerializer(RefuseUnknownFields, serializers.Serializer):
    disabled = serializers.ListField(
        child=serializers.ChoiceField(choices=KIND_NAMES),
        allow_empty=True,
        help_text="Notification kinds turned off; every other kind is on.",
    )
    kinds = serializers.ListField(child=serializers.CharField(), read_only=True, help_text="Every kind there is.")


class WebhookSerializer(ServiceSerializer):
    secret = serializers.CharField(
        write_only=True,
        required=False,
        min_length=16,
        max_length=4096,
        trim_whitespace=False,
        style={"input_type": "password"},
        help_text="Write-only HMAC-SHA256 signing key: stored encrypted, never returned. On update, omit to keep.",
    )
    event_kinds = serializers.ListField(child=serializers.CharField(max_length=100), allow_empty=False)
    service_create = staticmethod(services.create_webhook)
    service_update = staticmethod(services.update_webhook)

    class Meta:
        model = Webhook
        fields = ["id", "name", "url", "event_kinds", "active", "secret", "created"]
        read_only_fields = ["created"]

    def validate(self, attrs):
        if self.instance is None and not attrs.get("secret"):
            raise serializers.ValidationError({"secret": ["required"]})
        return attrs


class WebhookDeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "webhook",
            "event_kind",
            "state",
            "attempts",
            "status_code",
            "duration_ms",
            "last_error",
            "created",
            "next_attempt",
            "finished",
        ]


class NotificationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Notification
        fields = [
            "id",
            "user",
            "kind",
            "event_kind",
            "email",
            "subject",
            "state",
            "attempts",
            "last_error",
            "created",
            "next_attempt",
            "finished",
        ]
