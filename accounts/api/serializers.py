"""The API's serializers of users, their roles and their API tokens."""

from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework import serializers

from accounts import access, preferences
from accounts.models import ApiToken
from core.api.serializers import RefuseUnknownFields


class UserSerializer(serializers.ModelSerializer):
    # Not an EmailField: a user without an address has "" (no valid "email"-format string).
    email = serializers.CharField(read_only=True, help_text="Blank when the user has none.")

    class Meta:
        model = get_user_model()
        fields = [
            "id",
            "username",
            "first_name",
            "last_name",
            "email",
            "is_staff",
            "roles",
            "time_zone",
            "time_zone_in_use",
        ]
        read_only_fields = fields

    roles = serializers.SerializerMethodField(
        help_text="admin, operator, auditor, instructor, image-maintainer, approver"
    )
    time_zone = serializers.SerializerMethodField(help_text="The zone the user chose (an IANA name); blank: none.")
    time_zone_in_use = serializers.SerializerMethodField(
        help_text="The zone of the user's pages and e-mails: the chosen one, else their browser's, else the site's. "
        "The API itself always answers in UTC."
    )

    def get_roles(self, user) -> list[str]:
        return access.roles(user)

    def get_time_zone(self, user) -> str:
        return preferences.stored(user)[0]

    def get_time_zone_in_use(self, user) -> str:
        return preferences.zone_name(user)


class MeSerializer(RefuseUnknownFields, serializers.Serializer):
    time_zone = serializers.CharField(
        max_length=64, allow_blank=True, help_text="An IANA zone name such as Europe/Berlin; blank: none chosen."
    )


class UserRolesSerializer(RefuseUnknownFields, serializers.Serializer):
    roles = serializers.ListField(child=serializers.ChoiceField(choices=access.ALL_ROLES), max_length=10)


class ApiTokenSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scopes", "effective_scopes", "created", "expires", "last_used"]
        read_only_fields = ["id", "prefix", "created", "last_used"]

    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=access.SCOPES),
        required=False,
        default=list,
        max_length=5,
        help_text="read (always), reserve, run, operate, admin",
    )
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
