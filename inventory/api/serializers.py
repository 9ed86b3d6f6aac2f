"""Serializers of the inventory API. create()/update() call the services, so the API writes
the same change log and events as the admin and the CLI."""

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from core.api.serializers import RefuseUnknownFields
from core.models import ObjectChange
from inventory import formats, services
from inventory.models import BladeCenter, Credential, Hypervisor, NodeGroup
from inventory.validators import FIRST_SLOT, HOST_MINIMUMS, INT_MAX, MAX_SLOTS, RATIO_MAX, RATIO_MIN


def as_drf(exc):
    """A Django ValidationError from a service → DRF's, so the API answers 400 with fields."""
    if hasattr(exc, "error_dict"):
        detail = {("non_field_errors" if k == NON_FIELD_ERRORS else k): v for k, v in exc.message_dict.items()}
        return serializers.ValidationError(detail)
    return serializers.ValidationError(exc.messages)


class ServiceSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    """ModelSerializer whose writes are ``service_create`` / ``service_update`` calls."""

    service_create = service_update = None

    def create(self, validated_data):
        try:
            return type(self).service_create(actor=self.context["request"].user, **validated_data)
        except DjangoValidationError as exc:
            raise as_drf(exc) from None

    def update(self, instance, validated_data):
        fresh = type(instance).objects.get(pk=instance.pk)
        try:
            return type(self).service_update(fresh, actor=self.context["request"].user, **validated_data)
        except DjangoValidationError as exc:
            raise as_drf(exc) from None


class NameField(serializers.SlugRelatedField):
    def __init__(self, queryset, **kwargs):
        super().__init__(slug_field="name", queryset=queryset, allow_null=True, required=False, **kwargs)


class TagListField(serializers.ListField):
    child = serializers.CharField(max_length=100)

    def to_representation(self, data):
        if hasattr(data, "all"):
            return sorted(tag.name for tag in data.all())
        return super().to_representation(data)


class CredentialSerializer(ServiceSerializer):
    secret = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=4096,
        trim_whitespace=False,
        style={"input_type": "password"},
        help_text="Write-only: stored encrypted, never returned. On update, omit to keep, '' to remove.",
    )
    has_secret = serializers.BooleanField(read_only=True)
    endpoints = serializers.ListField(
        child=serializers.CharField(max_length=500),
        required=False,
        max_length=100,
        help_text="The URLs the secret may be sent to (a BMC's https://host:port, a vCenter's URL), kept as "
        "origins; nowhere else. On update they change only with the secret given again.",
    )
    service_create = staticmethod(services.create_credential)
    service_update = staticmethod(services.update_credential)

    class Meta:
        model = Credential
        fields = ["id", "name", "username", "secret", "has_secret", "endpoints", "description", "created", "updated"]
        read_only_fields = ["created", "updated"]


class HypervisorCountMixin(serializers.Serializer):
    hypervisor_count = serializers.SerializerMethodField()

    def get_hypervisor_count(self, obj) -> int:
        count = getattr(obj, "hypervisor_count", None)
        return obj.hypervisors.count() if count is None else count


class NodeGroupSerializer(HypervisorCountMixin, ServiceSerializer):
    service_create = staticmethod(services.create_node_group)
    service_update = staticmethod(services.update_node_group)

    class Meta:
        model = NodeGroup
        fields = ["id", *services.GROUP_FIELDS, "hypervisor_count", "created", "updated"]
        read_only_fields = ["created", "updated"]


class BladeCenterSerializer(HypervisorCountMixin, ServiceSerializer):
    bmc_credential = NameField(Credential.objects.all())
    service_create = staticmethod(services.create_blade_center)
    service_update = staticmethod(services.update_blade_center)

    class Meta:
        model = BladeCenter
        fields = ["id", *services.CHASSIS_FIELDS, "hypervisor_count", "created", "updated"]
        read_only_fields = ["created", "updated"]


class HypervisorSerializer(ServiceSerializer):
    credential = NameField(Credential.objects.all())
    blade_center = NameField(BladeCenter.objects.all())
    group = NameField(NodeGroup.objects.all())
    bmc_credential = NameField(Credential.objects.all())
    tags = TagListField(required=False, max_length=100)
    hypervisor_type = serializers.CharField(read_only=True)
    scheduled_state = serializers.CharField(read_only=True, help_text="drained, offline, or blank: nothing scheduled")
    service_create = staticmethod(services.create_hypervisor)
    service_update = staticmethod(services.update_hypervisor)

    class Meta:
        model = Hypervisor
        fields = [
            "id",
            "name",
            "address",
            "driver",
            "hypervisor_type",
            "uri",
            "credential",
            "blade_center",
            "slot",
            "group",
            "cpus",
            "memory_mib",
            "disk_gib",
            "cpu_ratio",
            "memory_ratio",
            "disk_ratio",
            "reserved_cpus",
            "reserved_memory_mib",
            "reserved_disk_gib",
            "max_vms",
            "spindles",
            "overlay",
            "driver_options",
            "devices",
            "state",
            "state_reason",
            "state_changed_by",
            "state_changed_at",
            "tags",
            "facts",
            "facts_updated_at",
            "bmc_address",
            "bmc_credential",
            "bmc_system",
            "bmc_verify_tls",
            "bmc_allow_http",
            "power_state",
            "power_state_at",
            "power_standby",
            "created",
            "updated",
        ]
        fields += ["scheduled_state", "scheduled_reason", "scheduled_until", "scheduled_by"]
        read_only_fields = [
            "state",
            "state_reason",
            "state_changed_by",
            "state_changed_at",
            "facts",
            "facts_updated_at",
            "power_state",
            "power_state_at",
            "power_standby",
            "created",
            "updated",
        ]
        read_only_fields += ["scheduled_state", "scheduled_reason", "scheduled_until", "scheduled_by"]
        validators = []  # name and slot uniqueness: the service checks them (case-insensitive names)


class StateChangeSerializer(RefuseUnknownFields, serializers.Serializer):
    state = serializers.ChoiceField(choices=Hypervisor.State.choices)
    reason = serializers.CharField(max_length=500, help_text="Why; required, kept in the change log.")


class PowerStateSerializer(serializers.Serializer):
    power_state = serializers.ChoiceField(choices=Hypervisor.PowerState.choices, read_only=True)
    power_state_at = serializers.DateTimeField(read_only=True, allow_null=True)
    power_standby = serializers.BooleanField(read_only=True)


class ScheduleSerializer(RefuseUnknownFields, serializers.Serializer):
    # Plain strings (the service checks them): an enum named "state" would collide in the schema.
    state = serializers.CharField(max_length=10, help_text="drained or offline")
    reason = serializers.CharField(max_length=400, help_text="Why; required, kept in the change log.")


class ObjectChangeSerializer(serializers.ModelSerializer):
    class Meta:
        model = ObjectChange
        fields = ["id", "time", "actor", "action", "changes", "reason"]
        read_only_fields = fields


class SlotSerializer(serializers.Serializer):
    slot = serializers.IntegerField()
    id = serializers.IntegerField(allow_null=True, help_text="The hypervisor in the slot; null when empty.")
    name = serializers.CharField(allow_null=True)
    state = serializers.CharField(allow_null=True)


# --- bulk import ----------------------------------------------------------------------


class ImportRequestSerializer(RefuseUnknownFields, serializers.Serializer):
    file = serializers.FileField(required=False, help_text="A CSV, XLSX, JSON or YAML file (multipart).")
    data = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Or the file's text (CSV, JSON or YAML) in a JSON body.",
    )
    rows = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        max_length=100_000,
        help_text="Or the rows themselves, one object per hypervisor.",
    )
    format = serializers.ChoiceField(
        choices=formats.FORMATS, required=False, help_text="Default: from the file name's extension."
    )
    dry_run = serializers.BooleanField(default=False, help_text="Validate and report; write nothing.")

    def validate(self, attrs):
        given = [key for key in ("file", "data", "rows") if attrs.get(key) is not None]
        if len(given) != 1:
            raise serializers.ValidationError("give exactly one of: file, data, rows")
        if "rows" in given:
            attrs["format"] = "json"
        elif "file" in given and not attrs.get("format"):
            attrs["format"] = formats.guess_format(attrs["file"].name)
            if attrs["format"] is None:
                raise serializers.ValidationError({"format": ["cannot tell from the file name; give format"]})
        elif "data" in given and attrs.get("format") in (None, "xlsx"):
            raise serializers.ValidationError({"format": ["give format: csv, json or yaml"]})
        return attrs


class ImportRowSerializer(serializers.Serializer):
    row = serializers.IntegerField(help_text="1 = the first row after the header")
    action = serializers.ChoiceField(choices=["create", "update", "unchanged", "reject"])
    name = serializers.CharField(allow_blank=True)
    id = serializers.IntegerField(allow_null=True)
    errors = serializers.ListField(child=serializers.CharField())


class ImportTotalsSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    updated = serializers.IntegerField()
    unchanged = serializers.IntegerField()
    rejected = serializers.IntegerField()
    rows = serializers.IntegerField()


class ImportReportSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    committed = serializers.BooleanField()
    ok = serializers.BooleanField()
    summary = serializers.CharField()
    totals = ImportTotalsSerializer()
    errors = serializers.ListField(child=serializers.CharField())
    rows = ImportRowSerializer(many=True)


class ErrorDetailSerializer(serializers.Serializer):
    status = serializers.IntegerField()
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()), required=False)


class ImportFailureSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()
    report = ImportReportSerializer(required=False)


# --- blade-center registration -------------------------------------------------------


class RegistrationRequestSerializer(RefuseUnknownFields, serializers.Serializer):
    name = serializers.CharField(max_length=100)
    site = serializers.CharField(max_length=100, required=False, allow_blank=True)
    model = serializers.CharField(max_length=100, required=False, allow_blank=True)
    slot_count = serializers.IntegerField(min_value=FIRST_SLOT, max_value=MAX_SLOTS)
    management_address = serializers.CharField(max_length=253, required=False, allow_blank=True)
    bmc_address = serializers.CharField(
        max_length=500,
        required=False,
        allow_blank=True,
        help_text="The chassis' Redfish service (https://…), for host power.",
    )
    bmc_credential = serializers.CharField(
        max_length=100, required=False, allow_null=True, help_text="The BMC's credential, by name."
    )
    notes = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    first_slot = serializers.IntegerField(min_value=FIRST_SLOT, max_value=MAX_SLOTS, required=False)
    last_slot = serializers.IntegerField(min_value=FIRST_SLOT, max_value=MAX_SLOTS, required=False)
    hostname_pattern = serializers.CharField(
        max_length=100,
        required=False,
        help_text="Default {chassis}-s{slot:02d}; placeholders {chassis} {slot} {index}.",
    )
    first_address = serializers.CharField(max_length=45, help_text="The next hosts get the next addresses.")
    driver = serializers.ChoiceField(choices=Hypervisor.Driver.choices, default="sim")
    uri_template = serializers.CharField(
        max_length=500,
        required=False,
        allow_blank=True,
        help_text="e.g. qemu+ssh://root@{address}/system; placeholders {address} {name} {slot} {index} {chassis}.",
    )
    credential = serializers.CharField(max_length=100, required=False, allow_null=True)
    group = serializers.CharField(max_length=100, required=False, allow_null=True)
    cpus = serializers.IntegerField(min_value=HOST_MINIMUMS["cpus"], max_value=INT_MAX)
    memory_mib = serializers.IntegerField(min_value=HOST_MINIMUMS["memory_mib"], max_value=INT_MAX)
    disk_gib = serializers.IntegerField(min_value=HOST_MINIMUMS["disk_gib"], max_value=INT_MAX)
    cpu_ratio = serializers.FloatField(min_value=RATIO_MIN, max_value=RATIO_MAX, required=False)
    memory_ratio = serializers.FloatField(min_value=RATIO_MIN, max_value=RATIO_MAX, required=False)
    disk_ratio = serializers.FloatField(min_value=RATIO_MIN, max_value=RATIO_MAX, required=False)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, max_length=100)
    dry_run = serializers.BooleanField(default=False, help_text="Preview only: validate, write nothing.")


class RegisteredHostSerializer(serializers.Serializer):
    slot = serializers.IntegerField()
    name = serializers.CharField()
    address = serializers.CharField()
    uri = serializers.CharField(allow_blank=True)


class RegisteredChassisSerializer(serializers.Serializer):
    id = serializers.IntegerField(allow_null=True, help_text="null in a dry run: nothing was created")
    name = serializers.CharField()
    site = serializers.CharField(allow_blank=True)
    model = serializers.CharField(allow_blank=True)
    slot_count = serializers.IntegerField()
    management_address = serializers.CharField(allow_blank=True)
    bmc_address = serializers.CharField(allow_blank=True)
    notes = serializers.CharField(allow_blank=True)


class RegistrationSerializer(serializers.Serializer):
    blade_center = RegisteredChassisSerializer()
    hosts = RegisteredHostSerializer(many=True)
    report = ImportReportSerializer()


class RegistrationFailureSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()
    report = ImportReportSerializer(required=False)
