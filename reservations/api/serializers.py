from datetime import timedelta

from django.contrib.auth.models import Group
from rest_framework import serializers
from rest_framework.reverse import reverse

from provisioning.vms.models import Image
from reservations import services
from reservations.models import BlockAllocation, Reservation
from vclmgr.api.serializers import HORIZON_MINUTES, MomentField, RefuseUnknownFields


class ReservationSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True, default=None, allow_null=True)
    image_name = serializers.CharField(source="image.name", read_only=True)
    vm_state = serializers.CharField(source="vm.state", read_only=True, default=None, allow_null=True)
    connection = serializers.SerializerMethodField()
    history = serializers.SerializerMethodField()

    class Meta:
        model = Reservation
        fields = [
            "id", "user", "image", "image_name", "start", "end", "status", "vcpus", "memory_mib", "disk_gib",
            "vm", "vm_state", "block", "attempts", "error", "degraded", "warned", "connection", "history", "created",
            "updated",
        ]  # fmt: skip
        read_only_fields = fields

    def get_connection(self, reservation) -> dict | None:
        """Login details once ready; the password only to the reservation's own user."""
        details = services.connection(reservation)
        request = self.context.get("request")
        if details is not None and (request is None or request.user.pk != reservation.user_id):
            details.pop("password", None)
        return details

    def get_history(self, reservation) -> list[dict]:
        return [{"status": h.status, "reason": h.reason, "at": h.at} for h in reservation.history.all()]


class ReservationCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    image = serializers.PrimaryKeyRelatedField(queryset=Image.objects.all())
    start = MomentField(required=False, allow_null=True, default=None, help_text="Blank: now.")
    end = MomentField(required=False, allow_null=True, default=None)
    duration_minutes = serializers.IntegerField(
        min_value=1, max_value=HORIZON_MINUTES, required=False, allow_null=True, default=None
    )
    ssh_key = serializers.CharField(required=False, allow_blank=True, default="", max_length=4000)
    request_key = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=64,
        help_text="Idempotency key: sending the same key again returns the first reservation.",
    )  # fmt: skip

    def validate(self, data):
        if (data["end"] is None) == (data["duration_minutes"] is None):
            raise serializers.ValidationError({"end": ["give either end or duration_minutes"]})
        if data["duration_minutes"] is not None:
            data["duration"] = timedelta(minutes=data.pop("duration_minutes"))
        else:
            data.pop("duration_minutes")
        return data


class FitCheckSerializer(ReservationCreateSerializer):
    ssh_key = None
    request_key = None


class FitSerializer(serializers.Serializer):
    fits = serializers.BooleanField()
    message = serializers.CharField()
    earliest = serializers.DateTimeField(allow_null=True)
    reasons = serializers.DictField(child=serializers.IntegerField())


class ExtendSerializer(RefuseUnknownFields, serializers.Serializer):
    end = MomentField()


class ReservationAcceptedSerializer(serializers.Serializer):
    reservation = ReservationSerializer()
    job = serializers.IntegerField(allow_null=True)
    job_url = serializers.CharField(allow_null=True)


def job_url(job, request):
    return None if job is None else reverse("job-detail", args=[job.pk], request=request)


class BlockAllocationSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    group = serializers.SlugRelatedField(slug_field="name", queryset=Group.objects.all())
    start = MomentField(help_text="Start of the first occurrence.")
    end = MomentField(help_text="End of the first occurrence.")
    usage = serializers.SerializerMethodField()

    class Meta:
        model = BlockAllocation
        fields = ["id", "name", "image", "group", "seats", "start", "end", "weeks", "canceled", "usage", "created"]
        read_only_fields = ["canceled", "usage", "created"]

    def get_usage(self, block) -> dict:
        return services.block_usage(block)

