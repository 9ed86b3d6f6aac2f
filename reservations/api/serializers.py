from datetime import timedelta

from django.contrib.auth.models import Group
from rest_framework import serializers
from rest_framework.reverse import reverse

from core import localtime
from core.api.serializers import HORIZON_MINUTES, MomentField, RefuseUnknownFields
from environments.models import EnvironmentTemplate
from environments.services import visible_templates
from provisioning.models import Image
from reservations import idle, services
from reservations.models import MAX_GPUS, ApprovalRequest, BlockAllocation, Reservation, UsageRollup


class ReservationSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True, default=None, allow_null=True)
    image_name = serializers.CharField(source="image.name", read_only=True)
    vm_state = serializers.CharField(source="vm.state", read_only=True, default=None, allow_null=True)
    connection = serializers.SerializerMethodField()
    history = serializers.SerializerMethodField()
    idle = serializers.SerializerMethodField()

    class Meta:
        model = Reservation
        fields = [
            "id",
            "user",
            "image",
            "image_name",
            "start",
            "end",
            "status",
            "vcpus",
            "memory_mib",
            "disk_gib",
            "gpus",
            "gpu_model",
            "vm",
            "vm_state",
            "block",
            "attempts",
            "error",
            "degraded",
            "warned",
            "connection",
            "history",
            "created",
            "updated",
            "idle",
            "connected_at",
            "reclaimed",
            "reclaimed_at",
            "template_of",
            "revision",
            "environment",
            "head",
            "hostname",
            "machines",
        ]
        read_only_fields = fields

    machines = serializers.SerializerMethodField()

    def get_machines(self, reservation) -> list[dict]:
        """An environment's head: every machine of it (the head first), with its status,
        address and how it is reached (``reach``: from the entry machine, by its name and
        private address on each of its networks, and directly when it has its own login
        address; ``reservations.environments.reach``); empty otherwise."""
        if reservation.environment_id is None or reservation.head_id is not None:
            return []
        machines = services.machines_of(reservation)
        reach = services.reach(reservation, machines)
        return [
            {
                "id": m.pk,
                "hostname": m.hostname,
                "image": m.image_id,
                "status": m.status,
                "vm_state": m.vm.state if m.vm else None,
                "address": m.vm.address if m.vm else None,
                "error": m.error,
                "reach": reach[m.hostname],
            }
            for m in machines
        ]

    def get_connection(self, reservation) -> dict | None:
        """Login details once ready; the password only to the reservation's own user."""
        details = services.connection(reservation)
        request = self.context.get("request")
        if details is not None and (request is None or request.user.pk != reservation.user_id):
            details.pop("password", None)
        return details

    def get_idle(self, reservation) -> dict | None:
        """The idle reclamation countdown: ``{"kind": "no_show"|"idle", "at", "minutes", "warned"}``."""
        return idle.countdown(reservation)

    def get_history(self, reservation) -> list[dict]:
        return [{"status": h.status, "reason": h.reason, "at": h.at} for h in reservation.history.all()]


class ReservationCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    image = serializers.PrimaryKeyRelatedField(
        queryset=Image.objects.all(), required=False, allow_null=True, default=None, help_text="Or environment."
    )
    environment = serializers.IntegerField(
        min_value=1,
        max_value=2**31 - 1,
        required=False,
        allow_null=True,
        default=None,
        help_text="An environment template's id, instead of image: every machine of it, as one reservation.",
    )
    start = MomentField(required=False, allow_null=True, default=None, help_text="Blank: now.")
    end = MomentField(required=False, allow_null=True, default=None)
    duration_minutes = serializers.IntegerField(
        min_value=1, max_value=HORIZON_MINUTES, required=False, allow_null=True, default=None
    )
    ssh_key = serializers.CharField(required=False, allow_blank=True, default="", max_length=4000)
    request_key = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=64,
        help_text="Idempotency key: sending the same key again returns the first reservation.",
    )
    gpus = serializers.IntegerField(
        min_value=0,
        max_value=MAX_GPUS,
        required=False,
        allow_null=True,
        default=None,
        help_text="Absent or null: the image's default_gpus.",
    )
    gpu_model = serializers.CharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        default=None,
        max_length=100,
        help_text="Blank: any model; absent or null: the image's default_gpu_model.",
    )

    def validate(self, data):
        if (data.get("image") is None) == (data.get("environment") is None):
            raise serializers.ValidationError({"image": ["give either image or environment"]})
        if data.get("environment") is not None and (data["gpus"] is not None or data["gpu_model"] is not None):
            raise serializers.ValidationError({"gpus": ["an environment's machines take their GPUs from its template"]})
        if (data["end"] is None) == (data["duration_minutes"] is None):
            raise serializers.ValidationError({"end": ["give either end or duration_minutes"]})
        if data["duration_minutes"] is not None:
            data["duration"] = timedelta(minutes=data.pop("duration_minutes"))
        else:
            data.pop("duration_minutes")
        return data


class FitCheckSerializer(ReservationCreateSerializer):
    image = serializers.PrimaryKeyRelatedField(queryset=Image.objects.all())
    environment = None
    ssh_key = None
    request_key = None


class FitSerializer(serializers.Serializer):
    fits = serializers.BooleanField()
    message = serializers.CharField()
    earliest = serializers.DateTimeField(allow_null=True)
    reasons = serializers.DictField(child=serializers.IntegerField())


class ExtendSerializer(RefuseUnknownFields, serializers.Serializer):
    end = MomentField()


class ApprovalRequestSerializer(serializers.ModelSerializer):
    requester = serializers.CharField(source="requester.username", read_only=True)
    image_name = serializers.CharField(source="image.name", read_only=True)
    decided_by = serializers.CharField(source="decided_by.username", read_only=True, default=None, allow_null=True)
    may_decide = serializers.SerializerMethodField(help_text="Whether you may approve or deny it now.")

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "kind",
            "status",
            "summary",
            "requester",
            "image",
            "image_name",
            "starts_at",
            "expires_at",
            "reason",
            "decided_by",
            "decided_at",
            "made_id",
            "created",
            "may_decide",
        ]
        read_only_fields = fields

    def get_may_decide(self, request) -> bool:
        from reservations import approvals

        user = getattr(self.context.get("request"), "user", None)
        return request.pending and approvals.may_decide(user, request)


class DecisionSerializer(RefuseUnknownFields, serializers.Serializer):
    reason = serializers.CharField(max_length=500, allow_blank=True, default="", help_text="Required to deny.")


class ReservationAcceptedSerializer(serializers.Serializer):
    reservation = ReservationSerializer(allow_null=True, help_text="None: it waits for approval (``approval``).")
    job = serializers.IntegerField(allow_null=True)
    job_url = serializers.CharField(allow_null=True)
    approval = ApprovalRequestSerializer(
        allow_null=True, required=False, help_text="The request waiting for an approver (an image that requires it)."
    )


class TemplateStartSerializer(RefuseUnknownFields, serializers.Serializer):
    revision = serializers.IntegerField(
        min_value=1, required=False, allow_null=True, default=None, help_text="Its number; blank: production."
    )
    ssh_key = serializers.CharField(required=False, allow_blank=True, default="", max_length=16000)


class TemplatePublishSerializer(RefuseUnknownFields, serializers.Serializer):
    production = serializers.BooleanField(default=False, help_text="Production at once; else testing.")
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=1000)
    keep = serializers.BooleanField(default=False, help_text="Keep the template (its VM) for the next round.")


class RevisionTestSerializer(RefuseUnknownFields, serializers.Serializer):
    duration = serializers.IntegerField(
        min_value=1, max_value=HORIZON_MINUTES, required=False, default=60, help_text="Minutes."
    )


class TemplatePublishedSerializer(serializers.Serializer):
    job = serializers.IntegerField(help_text="The capture job.")
    job_url = serializers.CharField()


def job_url(job, request):
    return None if job is None else reverse("job-detail", args=[job.pk], request=request)


class BlockAllocationSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    group = serializers.SlugRelatedField(slug_field="name", queryset=Group.objects.all())
    start = MomentField(help_text="Start of the first occurrence.")
    end = MomentField(help_text="End of the first occurrence.")
    time_zone = serializers.CharField(
        write_only=True,
        required=False,
        max_length=64,
        help_text="The zone whose local hour the weeks keep across daylight saving changes (an IANA name such "
        "as Europe/Berlin); default: yours (GET /api/v1/me/: time_zone_in_use).",
    )
    usage = serializers.SerializerMethodField()
    environment = serializers.PrimaryKeyRelatedField(
        queryset=EnvironmentTemplate.objects.none(),
        required=False,
        allow_null=True,
        help_text="An environment template's id: each seat is every machine of it (image: its entry machine's, "
        "which may be left out).",
    )

    class Meta:
        model = BlockAllocation
        fields = [
            "id",
            "name",
            "image",
            "environment",
            "group",
            "seats",
            "start",
            "end",
            "weeks",
            "time_zone",
            "canceled",
            "usage",
            "created",
        ]
        read_only_fields = ["canceled", "usage", "created"]
        extra_kwargs = {"image": {"required": False}}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:  # the templates its writer may use: another's is "does not exist"
            self.fields["environment"].queryset = visible_templates(request.user)

    def validate(self, attrs):
        if attrs.get("image") is None and attrs.get("environment") is None:
            raise serializers.ValidationError({"image": ["give an image or an environment"]})
        return attrs

    def get_usage(self, block) -> dict:
        return services.block_usage(block)

    def validate_time_zone(self, value):
        if not localtime.is_zone(value):
            raise serializers.ValidationError(f"{value!r} is not a time zone name such as Europe/Berlin")
        return localtime.zone(value)


# --- usage reports -----------------------------------------------------------------------------


class UsageQuerySerializer(serializers.Serializer):
    """The usage report's filters: UTC days ``from``..``to`` (default: the last 30 days)."""

    image = serializers.CharField(required=False, allow_blank=True, max_length=100)
    group = serializers.CharField(required=False, allow_blank=True, max_length=150)

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.DateField(required=False, allow_null=True)
        fields["to"] = serializers.DateField(required=False, allow_null=True)
        return fields


class UsageDaySerializer(serializers.Serializer):
    day = serializers.DateField()
    hours = serializers.FloatField()
    reservations = serializers.IntegerField()
    peak = serializers.IntegerField()
    refusals = serializers.IntegerField()


class UsageImageSerializer(serializers.Serializer):
    image = serializers.CharField()
    hours = serializers.FloatField()


class UsageGroupSerializer(serializers.Serializer):
    group = serializers.CharField(allow_blank=True)
    hours = serializers.FloatField()


class UsageRefusalSerializer(serializers.Serializer):
    reason = serializers.CharField()
    label = serializers.CharField()
    count = serializers.IntegerField()


class UsageTotalsSerializer(serializers.Serializer):
    hours = serializers.FloatField()
    reservations = serializers.IntegerField()
    refusals = serializers.IntegerField()


class UsagePeakSerializer(serializers.Serializer):
    value = serializers.IntegerField()
    day = serializers.DateField(allow_null=True)


class UsageReadySerializer(serializers.Serializer):
    count = serializers.IntegerField()
    mean_seconds = serializers.FloatField(allow_null=True)


class UsageFiltersSerializer(serializers.Serializer):
    image = serializers.CharField(allow_null=True)
    group = serializers.CharField(allow_null=True, allow_blank=True)


class UsageReportSerializer(serializers.Serializer):
    filters = UsageFiltersSerializer()
    totals = UsageTotalsSerializer()
    days = UsageDaySerializer(many=True)
    images = UsageImageSerializer(many=True)
    groups = UsageGroupSerializer(many=True)
    peak = UsagePeakSerializer()
    refusals = UsageRefusalSerializer(many=True)
    time_to_ready = UsageReadySerializer()

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.DateField()
        fields["to"] = serializers.DateField()
        return fields


# --- showback: every kind of use per user, class, group or image --------------------------------


class ShowbackQuerySerializer(serializers.Serializer):
    """The showback report's filters: UTC days ``from``..``to`` (or ``first``..``last``; default:
    the last 30 days), the grouping, and optional filters."""

    by = serializers.ChoiceField(choices=["user", "class", "group", "image"], required=False, default="user")
    image = serializers.CharField(required=False, allow_blank=True, max_length=100)
    group = serializers.CharField(required=False, allow_blank=True, max_length=150)
    kind = serializers.ChoiceField(choices=UsageRollup.Kind.choices, required=False, allow_blank=True)

    def get_fields(self):
        fields = super().get_fields()
        for name in ("from", "to", "first", "last"):
            fields[name] = serializers.DateField(required=False, allow_null=True)
        fields["class"] = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=2**53)
        return fields


class ShowbackMeasuresSerializer(serializers.Serializer):
    hours = serializers.FloatField()
    vcpu_hours = serializers.FloatField()
    gib_hours = serializers.FloatField(help_text="Memory held: GiB × hours.")
    gpu_hours = serializers.FloatField()
    uses = serializers.IntegerField(help_text="Uses that started in the range.")
    cost = serializers.FloatField(allow_null=True, help_text="From USAGE_PRICES; null when no price is set.")


class ShowbackRowSerializer(ShowbackMeasuresSerializer):
    key = serializers.CharField(allow_blank=True, help_text="User id, class id, group or image name.")
    label = serializers.CharField()
    budget_hours = serializers.FloatField(
        allow_null=True, help_text="The class's hours budget (by=class; by=user with class: each student's class's)."
    )
    budget_extra_hours = serializers.FloatField(
        allow_null=True, help_text="Extra hours granted to the student (by=user with class; the term's, now)."
    )
    budget_used_hours = serializers.FloatField(
        allow_null=True, help_text="Hours of the budget used outside sessions (by=user with class; the term's, now)."
    )
    budget_left_hours = serializers.FloatField(
        allow_null=True, help_text="Hours of the budget left (by=user with class; the term's, now)."
    )


class ShowbackKindSerializer(ShowbackMeasuresSerializer):
    kind = serializers.ChoiceField(choices=UsageRollup.Kind.choices)


class ShowbackFiltersSerializer(serializers.Serializer):
    image = serializers.CharField(allow_null=True)
    group = serializers.CharField(allow_null=True, allow_blank=True)
    kind = serializers.CharField(allow_null=True)

    def get_fields(self):
        fields = super().get_fields()
        fields["class"] = serializers.IntegerField(allow_null=True)
        return fields


class ShowbackReportSerializer(serializers.Serializer):
    by = serializers.ChoiceField(choices=["user", "class", "group", "image"])
    filters = ShowbackFiltersSerializer()
    currency = serializers.CharField(allow_null=True, allow_blank=True)
    prices = serializers.DictField(child=serializers.FloatField(), allow_null=True)
    budgets = serializers.BooleanField(help_text="Whether some row has a class hours budget.")
    standings = serializers.BooleanField(help_text="Whether rows carry students' budget standings (used, extra, left).")
    totals = ShowbackMeasuresSerializer()
    kinds = ShowbackKindSerializer(many=True)
    rows = ShowbackRowSerializer(many=True)

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.DateField()
        fields["to"] = serializers.DateField()
        return fields
