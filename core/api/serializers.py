from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

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


class EventSerializer(serializers.ModelSerializer):
    time = serializers.DateTimeField(source="created")

    class Meta:
        model = Event
        fields = ["id", "topic", "kind", "time", "data"]
