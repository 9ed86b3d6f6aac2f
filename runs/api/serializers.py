import base64
import json

from rest_framework import serializers
from rest_framework.reverse import reverse

from core.api.serializers import RefuseUnknownFields
from provisioning.models import Image
from runs import services
from runs.models import Run, RunFile, RunOutput


class RunSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    image_name = serializers.CharField(source="image.name", read_only=True)
    env_names = serializers.SerializerMethodField(help_text="Its variables' names (values are never returned).")
    truncated = serializers.BooleanField(read_only=True)
    log_url = serializers.SerializerMethodField()
    kept_vm = serializers.SerializerMethodField(help_text="Its failed VM while kept stopped for inspection, else null.")

    class Meta:
        model = Run
        fields = [
            "id",
            "owner",
            "platform",
            "image",
            "image_name",
            "environment",
            "vm",
            "vcpus",
            "memory_mib",
            "disk_gib",
            "argv",
            "script",
            "env_names",
            "artifacts",
            "time_limit",
            "priority",
            "state",
            "exit_status",
            "error",
            "reason",
            "job",
            "output_seen",
            "output_kept",
            "truncated",
            "created",
            "started",
            "ended",
            "files_removed",
            "keep_failed_minutes",
            "capture_failed",
            "kept_until",
            "kept_vm",
            "captured_image",
            "log_url",
        ]
        read_only_fields = fields

    def get_env_names(self, run) -> list[str]:
        return sorted(run.env)

    def get_kept_vm(self, run) -> int | None:
        return services.kept_vm(run)

    def get_log_url(self, run) -> str:
        return reverse("run-log", args=[run.pk], request=self.context.get("request"))


class _JSONish(serializers.JSONField):
    """A JSON value, also given as a JSON string (a multipart form's field is text)."""

    def __init__(self, kind, **kwargs):
        self.kind = kind
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                raise serializers.ValidationError("not JSON") from None
        if not isinstance(data, self.kind):
            raise serializers.ValidationError(f"must be a JSON {'list' if self.kind is list else 'object'}")
        return data


class RunCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    platform = serializers.CharField(
        max_length=100,
        required=False,
        default="",
        allow_blank=True,
        help_text="os[/arch] as images declare them, e.g. debian-12",
    )
    image = serializers.PrimaryKeyRelatedField(
        queryset=Image.objects.all(), required=False, default=None, allow_null=True
    )
    environment = serializers.IntegerField(
        required=False,
        default=None,
        allow_null=True,
        min_value=1,
        max_value=2**31 - 1,
        help_text="An environment template's id, instead of platform or image: its machines are built and the "
        "command runs on its entry machine.",
    )
    argv = _JSONish(list, required=False, default=list, help_text="The command as a list of words.")
    script = serializers.CharField(required=False, default="", allow_blank=True, trim_whitespace=False)
    env = _JSONish(dict, required=False, default=dict)
    artifacts = _JSONish(list, required=False, default=list, help_text="Patterns under the work directory.")
    time_limit = serializers.IntegerField(required=False, default=None, allow_null=True, help_text="Seconds.")
    priority = serializers.CharField(required=False, default="batch")
    vcpus = serializers.IntegerField(required=False, default=None, allow_null=True, min_value=1)
    memory_mib = serializers.IntegerField(required=False, default=None, allow_null=True, min_value=16)
    disk_gib = serializers.IntegerField(required=False, default=None, allow_null=True, min_value=0)
    keep_failed_minutes = serializers.IntegerField(
        required=False, default=0, min_value=0, help_text="If it fails, keep its VM stopped this long (minutes)."
    )
    capture_failed = serializers.BooleanField(
        required=False, default=False, help_text="If it fails, capture its VM as your image before it is destroyed."
    )
    reason = serializers.CharField(required=False, default="", allow_blank=True, max_length=500)

    def to_internal_value(self, data):
        if hasattr(data, "keys"):  # input files come as file fields named input:<path> (multipart)
            data = {k: v for k, v in data.items() if not str(k).startswith("input:")}
        return super().to_internal_value(data)


class RunAcceptedSerializer(serializers.Serializer):
    run = RunSerializer()
    job = serializers.IntegerField(allow_null=True)
    job_url = serializers.URLField(allow_null=True)


class RunOutputSerializer(serializers.ModelSerializer):
    text = serializers.SerializerMethodField(help_text="The bytes as UTF-8, invalid bytes replaced.")
    data_b64 = serializers.SerializerMethodField(help_text="The bytes exactly as printed (base64).")

    class Meta:
        model = RunOutput
        fields = ["seq", "offset", "text", "data_b64"]

    def get_text(self, chunk) -> str:
        return bytes(chunk.data).decode("utf-8", "replace")

    def get_data_b64(self, chunk) -> str:
        return base64.b64encode(bytes(chunk.data)).decode()


class RunLogSerializer(serializers.Serializer):
    chunks = RunOutputSerializer(many=True)
    next = serializers.IntegerField(help_text="Pass as after= for the next page.")
    state = serializers.CharField()
    exit_status = serializers.IntegerField(allow_null=True)
    ended = serializers.BooleanField()
    truncated = serializers.BooleanField()
    note = serializers.CharField(allow_blank=True)


class RunFileSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()

    class Meta:
        model = RunFile
        fields = ["id", "kind", "path", "size", "created", "url"]

    def get_url(self, item) -> str:
        return reverse("run-artifact", args=[item.run_id, item.pk], request=self.context.get("request"))


def log_page(run, after, limit):
    chunks, nxt = services.log(run, after, limit)
    return {
        "chunks": chunks,
        "next": nxt,
        "state": run.state,
        "exit_status": run.exit_status,
        "ended": run.is_final,
        "truncated": run.truncated,
        "note": services.truncation_note(run),
    }
