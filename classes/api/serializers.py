from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from classes import calendar, services
from classes.models import Class
from core.api.serializers import RefuseUnknownFields

MAX_ID = 2**63 - 1  # a larger id is no row (SQLite would raise instead of finding nothing)


class SessionSerializer(serializers.Serializer):
    weekday = serializers.IntegerField(min_value=0, max_value=6, help_text="0: Monday … 6: Sunday.")
    start = serializers.TimeField(help_text="Local time in the class's time zone.")
    minutes = serializers.IntegerField(min_value=5, max_value=12 * 60)


class ExceptionSerializer(serializers.Serializer):
    day = serializers.DateField(help_text="A local date the class does not meet.")
    reason = serializers.CharField(max_length=200, allow_blank=True, default="")


class MeetingSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    reserved = serializers.BooleanField(help_text="Its seats are claimed (a block allocation).")
    block = serializers.IntegerField(allow_null=True)


class StandingSerializer(serializers.Serializer):
    """One student's hours of a class's budget (``classes.budget``); hours as decimals."""

    student = serializers.CharField(help_text="The student's user name.")
    budget = serializers.DecimalField(
        max_digits=9, decimal_places=2, allow_null=True, help_text="The class's hours; null: no limit."
    )
    extra = serializers.DecimalField(max_digits=9, decimal_places=2, help_text="Extra hours granted to the student.")
    used = serializers.DecimalField(max_digits=9, decimal_places=2)
    left = serializers.DecimalField(max_digits=9, decimal_places=2, allow_null=True, help_text="null: no limit.")
    note = serializers.CharField()

    @staticmethod
    def of(user, standing):
        return {
            "student": user.get_username(),
            "budget": standing.budget,
            "extra": standing.extra,
            "used": standing.used,
            "left": standing.left,
            "note": standing.note(),
        }


class GrantSerializer(RefuseUnknownFields, serializers.Serializer):
    student = serializers.CharField(max_length=150, help_text="A member's user name.")
    hours = serializers.DecimalField(
        max_digits=7, decimal_places=2, help_text="Extra hours (negative: taken back, never below none extra)."
    )
    reason = serializers.CharField(max_length=200)
    id = serializers.IntegerField(read_only=True)
    at = serializers.DateTimeField(read_only=True)
    granted_by = serializers.CharField(read_only=True, allow_null=True)


class ClassSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    # Ids looked up among what the user may see (``views``): another course or image is "no such".
    course = serializers.IntegerField(source="course_id", min_value=1, max_value=MAX_ID, help_text="The group's id.")
    image = serializers.IntegerField(source="image_id", min_value=1, max_value=MAX_ID, help_text="The image's id.")
    environment = serializers.IntegerField(
        source="environment_id",
        min_value=1,
        max_value=MAX_ID,
        required=False,
        allow_null=True,
        help_text="An environment template's id: each seat is its machines (image: its entry machine's).",
    )
    time_zone = serializers.CharField(max_length=64, required=False, help_text="IANA name; default: yours.")
    sessions = SessionSerializer(many=True)
    exceptions = ExceptionSerializer(many=True, required=False)
    next_sessions = serializers.SerializerMethodField()

    class Meta:
        model = Class
        fields = [
            "id",
            "name",
            "course",
            "image",
            "environment",
            "time_zone",
            "first_day",
            "last_day",
            "sessions",
            "exceptions",
            "seats",
            "lead_minutes",
            "vcpus",
            "memory_mib",
            "gpus",
            "gpu_model",
            "hours_budget",
            "requires_approval",
            "problem",
            "next_sessions",
            "created",
        ]
        read_only_fields = ["problem", "next_sessions", "created"]
        validators = []  # the service checks the term (a clear message per field)

    def to_representation(self, klass):
        data = super().to_representation(klass)
        data["sessions"] = [SessionSerializer(s).data for s in klass.sessions.all()]
        data["exceptions"] = [ExceptionSerializer(e).data for e in klass.exceptions.all()]
        return data

    @extend_schema_field(MeetingSerializer(many=True))
    def get_next_sessions(self, klass):
        return [
            {"start": o.start, "end": o.end, "reserved": m is not None, "block": m.block_id if m else None}
            for o, m in services.upcoming(klass)
        ]

    @staticmethod
    def service_values(data):
        """The validated data as ``services.create_class`` / ``change_class`` take it."""
        values = dict(data)
        if "sessions" in values:
            values["sessions"] = [calendar.Session(s["weekday"], s["start"], s["minutes"]) for s in values["sessions"]]
        if "exceptions" in values:
            values["exceptions"] = [(e["day"], e["reason"]) for e in values["exceptions"]]
        return values
