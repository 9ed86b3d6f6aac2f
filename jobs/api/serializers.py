from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.reverse import reverse

from core.api.serializers import RefuseUnknownFields
from jobs import registry
from jobs.models import Job, JobLog, QueueSettings

STATUSES = [choice[0] for choice in Job.Status.choices]


@extend_schema_field(
    {
        "type": "array",
        "items": {
            "type": "array",
            "minItems": 3,
            "maxItems": 3,
            "items": {"type": "string"},
        },
        "description": "Reason trail: [source, reason, ISO time] entries, oldest first.",
    }
)
class TrailField(serializers.JSONField):
    pass


@extend_schema_field(
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "job": {"type": "integer"},
                "statuses": {"type": "array", "items": {"type": "string", "enum": list(Job.FINAL)}},
            },
            "required": ["job", "statuses"],
        },
        "description": "Dependencies: start after each job ended in one of its statuses ([] = any final status).",
    }
)
class DependsField(serializers.ReadOnlyField):
    def to_representation(self, job):
        return [{"job": d.on_id, "statuses": list(d.accepted)} for d in job.dependencies.all()]


@extend_schema_field({"type": "array", "items": {"type": "array", "items": {"type": "string"}, "minItems": 2}})
class PairsField(serializers.JSONField):
    pass


class ErrorInfoSerializer(serializers.Serializer):
    kind = serializers.CharField()
    message = serializers.CharField()


class ProgressSerializer(serializers.Serializer):
    done = serializers.IntegerField()
    total = serializers.IntegerField(allow_null=True)
    step = serializers.CharField(allow_null=True)


class JobSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()
    log_url = serializers.SerializerMethodField()
    submitter = serializers.SlugRelatedField(slug_field="username", read_only=True)
    reason = TrailField(read_only=True)
    depends = DependsField(source="*")
    locks = PairsField(read_only=True, help_text='[[name, "shared"|"exclusive"], …]')
    buckets = serializers.SerializerMethodField()
    children = serializers.SerializerMethodField()
    steps = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    params = serializers.JSONField(read_only=True)
    result = serializers.JSONField(read_only=True, allow_null=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "url",
            "log_url",
            "opcode",
            "params",
            "status",
            "priority",
            "submitter",
            "reason",
            "depends",
            "locks",
            "buckets",
            "parent",
            "children",
            "retry_of",
            "received",
            "started",
            "ended",
            "waiting_for",
            "awaiting_children",
            "progress",
            "steps",
            "attempt",
            "runner",
            "cancel_requested",
            "result",
            "error",
            "archived",
        ]
        read_only_fields = fields

    def get_url(self, job) -> str:
        return reverse("job-detail", args=[job.pk], request=self.context.get("request"))

    def get_log_url(self, job) -> str:
        return reverse("job-log", args=[job.pk], request=self.context.get("request"))

    def get_buckets(self, job) -> list[dict]:
        return [{"reason": key, "size": n} for key, n in job.buckets]

    def get_children(self, job) -> list[int]:
        return [child.pk for child in job.children.all()]

    def get_steps(self, job) -> list[str]:
        return [step["name"] for step in job.steps]

    @extend_schema_field(ProgressSerializer)
    def get_progress(self, job):
        progress = job.progress or {}
        return {"done": progress.get("done", 0), "total": progress.get("total"), "step": progress.get("step")}

    @extend_schema_field(ErrorInfoSerializer(allow_null=True))
    def get_error(self, job):
        if not (job.error_kind or job.error_message):
            return None
        return {"kind": job.error_kind, "message": job.error_message}


class JobSubmitSerializer(RefuseUnknownFields, serializers.Serializer):
    opcode = serializers.CharField(max_length=64)
    params = serializers.DictField(required=False, default=dict)
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=False)
    priority = serializers.IntegerField(
        required=False, default=0, min_value=Job.MIN_PRIORITY, max_value=Job.MAX_PRIORITY
    )
    depends = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        default=list,
        max_length=100,
        help_text="Job ids (accepting success), or [job id, [statuses]] ([] = any final status).",
    )

    def validate_opcode(self, value):
        if not registry.registered(value):
            known = ", ".join(op.name for op in registry.all_opcodes())
            raise serializers.ValidationError(f"unknown opcode {value!r} (known: {known})")
        return value


class JobBatchItemSerializer(JobSubmitSerializer):
    name = serializers.CharField(
        max_length=100, required=False, help_text='Lets later jobs of this batch depend on this one as "@name".'
    )
    depends = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        default=list,
        max_length=100,
        help_text='Job ids or "@name" of a job in this batch, or [id or "@name", [statuses]].',
    )


class JobBatchSerializer(RefuseUnknownFields, serializers.Serializer):
    jobs = JobBatchItemSerializer(many=True, min_length=1, max_length=1000)


class JobActionSerializer(RefuseUnknownFields, serializers.Serializer):
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


class JobLogSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobLog
        fields = ["id", "time", "level", "message"]


class QueueBucketSerializer(serializers.Serializer):
    reason = serializers.CharField()
    label = serializers.CharField()
    size = serializers.IntegerField()
    running = serializers.IntegerField()


class QueueSerializer(RefuseUnknownFields, serializers.Serializer):
    limit = serializers.IntegerField(
        min_value=QueueSettings.LIMIT_RANGE[0],
        max_value=QueueSettings.LIMIT_RANGE[1],
        required=False,
        help_text="At most this many jobs run at once.",
    )
    lease_seconds = serializers.IntegerField(
        min_value=QueueSettings.LEASE_RANGE[0], max_value=QueueSettings.LEASE_RANGE[1], required=False
    )
    max_attempts = serializers.IntegerField(
        min_value=QueueSettings.ATTEMPTS_RANGE[0], max_value=QueueSettings.ATTEMPTS_RANGE[1], required=False
    )
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, write_only=True)
    running = serializers.IntegerField(read_only=True)
    queued = serializers.IntegerField(read_only=True)
    waiting = serializers.IntegerField(read_only=True)
    awaiting_children = serializers.IntegerField(read_only=True)
    buckets = QueueBucketSerializer(many=True, read_only=True)
    updated = serializers.DateTimeField(read_only=True)


class OpcodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    staff_only = serializers.BooleanField()
    params = serializers.SerializerMethodField()

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_params(self, op):
        out = {}
        for name, field in op.params().fields.items():
            out[name] = {
                "type": type(field).__name__.replace("Field", "").lower(),
                "required": field.required,
                "help": str(field.help_text or ""),
            }
            if not field.required and field.default is not serializers.empty:
                default = field.default() if callable(field.default) else field.default
                out[name]["default"] = default
        return out
