from datetime import timedelta

from accounts.models import ApiToken
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework import serializers

from accounts import access
from core.models import Event


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
        fields = ["id", "username", "first_name", "last_name", "email", "is_staff", "roles"]
        read_only_fields = fields

    roles = serializers.SerializerMethodField(help_text="admin, operator, auditor, instructor, image-maintainer")

    def get_roles(self, user) -> list[str]:
        return access.roles(user)


class UserRolesSerializer(RefuseUnknownFields, serializers.Serializer):
    roles = serializers.ListField(child=serializers.ChoiceField(choices=access.ALL_ROLES), max_length=10)


class ApiTokenSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scopes", "effective_scopes", "created", "expires", "last_used"]
        read_only_fields = ["id", "prefix", "created", "last_used"]

    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=access.SCOPES), required=False, default=list, max_length=5,
        help_text="read (always), reserve, run, operate, admin",
    )  # fmt: skip
    effective_scopes = serializers.SerializerMethodField(help_text="The scopes ∩ what the user's roles allow now.")

    def get_effective_scopes(self, token) -> list[str]:
        have = access.effective_scopes(token)
        return [scope for scope in access.SCOPES if scope in have]

    def validate_scopes(self, value):
        """Never more than the user, nor than the token this request came with."""
        request = self.context["request"]
        allowed = access.allowed_scopes(request.user)
        if isinstance(request.auth, ApiToken):
            allowed &= access.effective_scopes(request.auth)
        beyond = sorted(set(value) - allowed - {"read"})
        if beyond:
            raise serializers.ValidationError(f"you may not give a token the scope {beyond[0]!r}")
        return value

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
