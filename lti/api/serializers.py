"""The LTI API's serializers: platforms (their deployments as a list of ids) and the tool's
public key facts. No field ever carries a private key: django-lti's per-registration static
keys are not exposed at all."""

from lti_tool.models import LtiRegistration
from rest_framework import serializers

from core.api.serializers import RefuseUnknownFields
from inventory.api.serializers import ServiceSerializer
from lti import services


class DeploymentIdsField(serializers.ListField):
    """The platform's active deployment ids (its ``LtiDeployment`` rows), read and written as a list."""

    child = serializers.CharField(max_length=255)

    def __init__(self, **kwargs):
        super().__init__(source="*", allow_empty=False, help_text="the LMS's deployment ids", **kwargs)

    def to_representation(self, instance):
        return services.active_deployment_ids(instance)

    def to_internal_value(self, data):
        return {"deployment_ids": super().to_internal_value(data)}


class PlatformSerializer(ServiceSerializer):
    service_create = staticmethod(services.add_platform)
    service_update = staticmethod(services.update_platform)

    deployment_ids = DeploymentIdsField()

    class Meta:
        model = LtiRegistration
        fields = [
            "id",
            "uuid",
            "name",
            "issuer",
            "client_id",
            "audience",
            "keyset_url",
            "auth_url",
            "token_url",
            "is_active",
            "deployment_ids",
            "datetime_created",
        ]
        read_only_fields = ["id", "uuid", "datetime_created"]


class KeySerializer(serializers.Serializer):
    kid = serializers.CharField(read_only=True)
    is_active = serializers.BooleanField(read_only=True, help_text="published in the JWKS")
    created = serializers.DateTimeField(read_only=True)


class RotateSerializer(RefuseUnknownFields, serializers.Serializer):
    retire_after_days = serializers.IntegerField(
        min_value=0, required=False, help_text="retire active keys older than this (default LTI_KEY_RETIRE_DAYS)"
    )


class RotatedSerializer(serializers.Serializer):
    kid = serializers.CharField(help_text="the new key, which signs from now on")
    retired = serializers.ListField(child=serializers.CharField(), help_text="kids no longer in the JWKS")
