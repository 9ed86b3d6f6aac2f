from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework import serializers

from vclmgr.models import ApiToken, Event


class RefuseUnknownFields:
    """Mixin for every serializer that reads a request body: a field it does not know is refused
    (400 naming it) rather than ignored, so a misspelt ``duraton_minutes`` never silently means
    "the default". Read-only fields sent back (a GET body PUT again) are still ignored."""

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            unknown = sorted(set(data.keys()) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        return super().to_internal_value(data)


HORIZON = timedelta(days=36525)  # 100 years
HORIZON_MINUTES = int(HORIZON.total_seconds() // 60)


class MomentField(serializers.DateTimeField):
    """A date and time at most 100 years from now: beyond it nothing is meant, and adding a
    duration to a time near year 9999 overflows (a server error instead of a 400)."""

    def to_internal_value(self, value):
        moment = super().to_internal_value(value)
        now = timezone.now()
        if not now - HORIZON <= moment <= now + HORIZON:
            raise serializers.ValidationError("must be within 100 years of now")
        return moment


class UserSerializer(serializers.ModelSerializer):
    # Not an EmailField: a user without an address has "" (no valid "email"-format string).
    email = serializers.CharField(read_only=True, help_text="Blank when the user has none.")

    class Meta:
        model = get_user_model()
        fields = ["id", "username", "first_name", "last_name", "email", "is_staff"]
        read_only_fields = fields


class ApiTokenSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "write_enabled", "created", "expires", "last_used"]
        read_only_fields = ["id", "prefix", "created", "last_used"]

    def validate_expires(self, value):
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("must be in the future")
        return value

    def validate_name(self, value):
        user = self.context["request"].user
        if ApiToken.objects.filter(user=user, name=value).exists():
            raise serializers.ValidationError("you already have a token with this name")
        return value


class NewApiTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class EventSerializer(serializers.ModelSerializer):
    time = serializers.DateTimeField(source="created")

    class Meta:
        model = Event
        fields = ["id", "topic", "kind", "time", "data"]
