import copy

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from rest_framework import serializers

from core.api.serializers import MomentField, RefuseUnknownFields
from drivers.base import FORMATS
from drivers.sim import steps
from drivers.sim.models import SimFault
from inventory.api.serializers import as_drf  # noqa: F401 (re-exported for the views)
from inventory.models import NodeGroup
from provisioning import services
from provisioning.models import VM, Image, ImageRevision, ImageVariant, QuotaRule


class ImageVariantSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    guest_password = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=200,
        trim_whitespace=False,
        style={"input_type": "password"},
        help_text="VMware: the guest user's password (write-only, stored encrypted).",
    )
    has_guest_password = serializers.BooleanField(read_only=True)

    class Meta:
        model = ImageVariant
        fields = [
            "id",
            "image",
            "revision",
            "hypervisor_type",
            "format",
            "location",
            "checksum",
            "size_gib",
            "kernel",
            "kernel_checksum",
            "initrd",
            "initrd_checksum",
            "kernel_args",
            "guest_username",
            "guest_password",
            "has_guest_password",
            "created",
        ]
        read_only_fields = ["revision", "created"]
        validators = []  # the service reports a duplicate type with a clear message


class ImageSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    groups = serializers.PrimaryKeyRelatedField(queryset=Group.objects.all(), many=True, required=False)
    required_tags = serializers.ListField(
        child=serializers.CharField(max_length=100), max_length=20, required=False, help_text="Host tags its VMs need."
    )
    forbidden_tags = serializers.ListField(
        child=serializers.CharField(max_length=100), max_length=20, required=False, help_text="Host tags its VMs avoid."
    )
    variants = serializers.SerializerMethodField()

    class Meta:
        model = Image
        fields = [
            "id",
            "name",
            "os",
            "platform",
            "description",
            "min_vcpus",
            "min_memory_mib",
            "min_disk_gib",
            "default_vcpus",
            "default_memory_mib",
            "default_disk_gib",
            "default_gpus",
            "default_gpu_model",
            "visibility",
            "groups",
            "parent",
            "revert_on_end",
            "pool_size",
            "warm_min",
            "warm_max",
            "active",
            "user_data",
            "ready_timeout",
            "readiness",
            "required_tags",
            "forbidden_tags",
            "anti_affinity",
            "exclusive_storage",
            "max_concurrent",
            "on_host_failure",
            "requires_approval",
            "variants",
            "owner",
            "created",
            "updated",
        ]
        read_only_fields = ["owner", "created", "updated"]

    def get_variants(self, image) -> list[dict]:
        """The production revision's (``services.with_production_variants`` read them with the list;
        an image just written, whose prefetch DRF drops, reads them here)."""
        rows = getattr(image, "_prefetched_objects_cache", {}).get("variants")
        return [
            {"hypervisor_type": v.hypervisor_type, "format": v.format, "size_gib": v.size_gib}
            for v in (rows if rows is not None else image.variants.production())
        ]


class RevisionVariantSerializer(RefuseUnknownFields, serializers.Serializer):
    """One disk of a new revision: the fields of an image variant."""

    hypervisor_type = serializers.ChoiceField(choices=ImageVariant.HV_TYPES)
    format = serializers.ChoiceField(choices=[(f, f) for f in FORMATS])
    location = serializers.CharField(max_length=1000, help_text="Path, file:// or http(s):// URL, or template name.")
    checksum = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    size_gib = serializers.IntegerField(min_value=0, max_value=1024 * 1024, required=False, default=0)
    kernel = serializers.CharField(
        max_length=1000, required=False, default="", allow_blank=True, help_text="Direct kernel boot: the kernel."
    )
    kernel_checksum = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    initrd = serializers.CharField(max_length=1000, required=False, default="", allow_blank=True)
    initrd_checksum = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    kernel_args = serializers.CharField(
        max_length=1024, required=False, default="", allow_blank=True, trim_whitespace=False
    )
    guest_username = serializers.CharField(max_length=150, required=False, default="", allow_blank=True)
    guest_password = serializers.CharField(
        write_only=True, required=False, default="", allow_blank=True, max_length=200, trim_whitespace=False
    )


class ImageRevisionVariantSerializer(serializers.ModelSerializer):
    class Meta:
        model = ImageVariant
        fields = ["id", "hypervisor_type", "format", "size_gib"]
        read_only_fields = fields


class ImageRevisionSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    """A revision; created with its disks (``variants``) in ``testing``. Its state changes only
    through make-production and retire."""

    # A plain string (not an enum) so its schema name does not collide with other "state" enums.
    state = serializers.CharField(read_only=True, help_text=", ".join(ImageRevision.State.values))
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    variants = ImageRevisionVariantSerializer(many=True, read_only=True)
    disks = RevisionVariantSerializer(
        many=True, write_only=True, min_length=1, max_length=len(ImageVariant.HV_TYPES), help_text="Its variants."
    )
    comment = serializers.CharField(max_length=2000, required=False, default="", allow_blank=True)

    class Meta:
        model = ImageRevision
        fields = ["id", "image", "number", "state", "created_by", "created", "parent", "comment", "variants", "disks"]
        read_only_fields = ["number", "created"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None and request.user.is_authenticated:
            self.fields["image"].queryset = services.visible_images(request.user)
            self.fields["parent"].queryset = ImageRevision.objects.filter(
                image__in=services.visible_images(request.user).values("pk")
            )


class VMSerializer(serializers.ModelSerializer):
    key = serializers.CharField(read_only=True)
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    host_name = serializers.CharField(source="host.name", read_only=True, default=None)
    # A plain string (not an enum) so its schema name does not collide with other "state" enums.
    state = serializers.CharField(read_only=True, help_text=", ".join(VM.State.values))

    class Meta:
        model = VM
        fields = [
            "id",
            "key",
            "name",
            "image",
            "variant",
            "revision",
            "host",
            "host_name",
            "allocation",
            "owner",
            "state",
            "vcpus",
            "memory_mib",
            "disk_gib",
            "end",
            "adhoc",
            "address",
            "port",
            "snapshots",
            "error",
            "created",
            "updated",
        ]
        read_only_fields = fields


class VMCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    image = serializers.PrimaryKeyRelatedField(queryset=Image.objects.all())
    name = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
    vcpus = serializers.IntegerField(min_value=1, max_value=1024, required=False)
    memory_mib = serializers.IntegerField(min_value=16, max_value=16 * 1024 * 1024, required=False)
    disk_gib = serializers.IntegerField(min_value=0, max_value=1024 * 1024, required=False)
    end = MomentField(
        required=False,
        allow_null=True,
        default=None,
        help_text="When it is destroyed (blank: the site's default time; staff: no end). At most the longest time "
        "a reservation may take.",
    )
    ssh_key = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=4000,
        help_text="A public key the guest lets its owner in with (blank: the image's own login).",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None and request.user.is_authenticated:
            self.fields["image"].queryset = services.visible_images(request.user)

    def validate_end(self, value):
        # A VM whose end has passed would be built only to be destroyed by the next clock tick.
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("must be in the future")
        return value


class JobAcceptedSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    vm = serializers.IntegerField()


class ImageShareSerializer(RefuseUnknownFields, serializers.Serializer):
    groups = serializers.PrimaryKeyRelatedField(
        queryset=Group.objects.all(), many=True, help_text="The groups that may use it (yours; none: its owner only)."
    )


class ImageRenameSerializer(RefuseUnknownFields, serializers.Serializer):
    name = serializers.CharField(max_length=100, help_text="The image's new name.")


class VMCaptureSerializer(RefuseUnknownFields, serializers.Serializer):
    image_name = serializers.CharField(max_length=100, help_text="Name of the new image (must not exist).")
    force = serializers.BooleanField(default=False, help_text="Power the VM off instead of a guest shutdown.")
    comment = serializers.CharField(
        max_length=1000, allow_blank=True, default="", help_text="Why, or what changed (the first revision's comment)."
    )


class VMResizeSerializer(RefuseUnknownFields, serializers.Serializer):
    vcpus = serializers.IntegerField(
        min_value=1, max_value=4096, required=False, help_text="Its vCPUs from now on (left out: as it has)."
    )
    memory_mib = serializers.IntegerField(
        min_value=16,
        max_value=1 << 30,
        required=False,
        help_text="Its memory in MiB from now on (left out: as it has).",
    )

    def validate(self, data):
        if not data:
            raise serializers.ValidationError("give vcpus, memory_mib or both")
        return data


class VMCreatedSerializer(JobAcceptedSerializer):
    detail = VMSerializer()


class SimFaultSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    step = serializers.ChoiceField(choices=steps.CHOICES)
    mode = serializers.ChoiceField(choices=SimFault.Mode.choices)
    seconds = serializers.FloatField(min_value=0, max_value=86400, required=False, allow_null=True, default=None)

    class Meta:
        model = SimFault
        fields = ["id", "step", "mode", "seconds", "created"]
        read_only_fields = ["id", "created"]


class PrestageSerializer(RefuseUnknownFields, serializers.Serializer):
    group = serializers.PrimaryKeyRelatedField(queryset=NodeGroup.objects.all())
    at = MomentField(required=False, allow_null=True, default=None, help_text="Blank: now.")


class PrestageAcceptedSerializer(serializers.Serializer):
    job = serializers.IntegerField(allow_null=True)
    schedule = serializers.IntegerField(allow_null=True)


class QuotaRuleSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    group = serializers.SlugRelatedField(
        slug_field="name", queryset=Group.objects.all(), allow_null=True, required=False
    )

    class Meta:
        model = QuotaRule
        fields = [
            "id",
            "name",
            "group",
            "image",
            "max_duration_minutes",
            "max_per_user",
            "max_per_group",
            "max_vcpus",
            "max_memory_mib",
        ]

    def validate(self, attrs):
        """The rule's own checks (never above a site default; group totals need a group), as the admin runs them."""
        rule = copy.copy(self.instance) if self.instance is not None else QuotaRule()
        for name, value in attrs.items():
            setattr(rule, name, value)
        try:
            rule.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        return attrs
