from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

import placement as core
from capacity import preemption, services
from capacity.durations import parse_duration
from core.api.serializers import MomentField, RefuseUnknownFields


def _name():
    return serializers.CharField(max_length=100)


class PlanRequestSerializer(RefuseUnknownFields, serializers.Serializer):
    vcpus = serializers.FloatField(min_value=0.01, max_value=10_000)
    memory_mib = serializers.FloatField(min_value=1, max_value=1e9)
    disk_gib = serializers.FloatField(min_value=0, max_value=1e7, default=0)
    start = MomentField(required=False, help_text="Default: now.")
    duration = serializers.CharField(required=False, max_length=20, help_text="e.g. 2h, 90m; default open-ended.")
    formats = serializers.ListField(
        child=_name(),
        required=False,
        max_length=10,
        help_text="Image formats available (a simulated host serves an image's simulated variant only: give image).",
    )
    image = serializers.CharField(
        required=False,
        max_length=200,
        help_text="An image's name: hosts are restricted to the hypervisor types it has variants for.",
    )
    required_tags = serializers.ListField(child=_name(), default=list, max_length=50)
    forbidden_tags = serializers.ListField(child=_name(), default=list, max_length=50)
    anti_affinity = serializers.CharField(max_length=100, default="", allow_blank=True)
    exclusive_storage = serializers.BooleanField(default=False, help_text="Only node groups with exclusive storage.")
    policy = serializers.ChoiceField(choices=[p.value for p in core.Policy], required=False)
    groups = serializers.ListField(child=_name(), required=False, max_length=100)
    priority = serializers.ChoiceField(
        choices=list(preemption.RANKS),
        required=False,
        help_text="The priority class it claims with: it may suspend runs of a lower class to fit (default: an "
        "interactive reservation's, RESERVATION_PRIORITY, when it starts now; none for a later start).",
    )

    def validate(self, data):
        if "image" in data:
            if "formats" in data:
                raise serializers.ValidationError({"image": ["give image or formats, not both"]})
            try:
                user = self.context["request"].user
                data["hypervisors"] = sorted(services.image_types(data["image"], user))
            except LookupError as error:
                raise serializers.ValidationError({"image": [str(error)]}) from None
        return data

    def validate_start(self, value):
        if not 2000 <= value.year <= 2200:
            raise serializers.ValidationError("must be between the years 2000 and 2200")
        if value < timezone.now() - timedelta(minutes=1):
            raise serializers.ValidationError("is in the past; placement plans from now on")
        return value

    def validate_duration(self, value):
        try:
            return parse_duration(value)
        except ValueError as error:
            raise serializers.ValidationError(str(error)) from None


class EarliestFitSerializer(serializers.Serializer):
    start = serializers.DateTimeField(allow_null=True)
    host = serializers.CharField(allow_null=True)
    summary = serializers.CharField()


class PlanResultSerializer(serializers.Serializer):
    fits = serializers.BooleanField()
    host = serializers.CharField(allow_null=True, help_text="Administrators only.")
    policy = serializers.CharField(allow_null=True)
    summary = serializers.CharField()
    reasons = serializers.DictField(child=serializers.IntegerField())
    closest_misses = serializers.ListField(child=serializers.DictField(), help_text="Administrators only.")
    earliest_fit = EarliestFitSerializer(allow_null=True)
    suspend = serializers.CharField(
        allow_blank=True,
        help_text="When it fits only if runs of a lower class are suspended: how many "
        "('fits if 2 batch runs are suspended'); a claim (a reservation starting now) would suspend them.",
    )
