"""Parameters of the VM app's opcodes (validated at submission) and the locks they take."""

from rest_framework import serializers

from drivers import base


class VMParams(serializers.Serializer):
    vm = serializers.IntegerField(min_value=1)


class CreateParams(VMParams):
    # Left out of a cold build's parameters (not defaulted), as before warm pools had them.
    warm = serializers.BooleanField(
        required=False, help_text="A VM taken from its image's warm pool: hand the login over, else build it cold."
    )


class StopParams(VMParams):
    force = serializers.BooleanField(default=False)


class SnapshotParams(VMParams):
    name = serializers.RegexField(base.IMAGE_NAME_RE, max_length=100)


class CaptureParams(VMParams):
    image_name = serializers.RegexField(base.IMAGE_NAME_RE, max_length=100)
    force = serializers.BooleanField(default=False, help_text="Pull the plug instead of a guest shutdown.")
    comment = serializers.CharField(
        max_length=1000, allow_blank=True, default="", help_text="Why, or what changed (the first revision's comment)."
    )
    # Left out of a plain capture's parameters (not defaulted), as before revisions had them.
    image = serializers.IntegerField(
        min_value=1,
        required=False,
        help_text="Capture as a new revision of this image (its maintainer's) instead of a new image.",
    )
    production = serializers.BooleanField(
        required=False, help_text="With ``image``: make the new revision production at once (else testing)."
    )


class MigrateParams(VMParams):
    target = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    plan = serializers.IntegerField(
        min_value=1, required=False, allow_null=True, default=None, help_text="The plan this move belongs to."
    )


class HostParams(serializers.Serializer):
    hypervisor = serializers.IntegerField(min_value=1)


class RefreshParams(HostParams):
    drain_unreachable = serializers.BooleanField(default=False)


def vm_lock(params):
    return [f"vm:{params['vm']}"]


def capture_locks(params):
    # Two captures to one new name would share the hypervisor's copy: one at a time per name.
    return [f"vm:{params['vm']}", f"image:{params['image_name']}"]


def host_lock(params):
    return [(f"hypervisor:{params['hypervisor']}", "shared")]


class StageParams(serializers.Serializer):
    image = serializers.IntegerField(min_value=1)
    hypervisor = serializers.IntegerField(min_value=1)


class UnstageParams(serializers.Serializer):
    hypervisor = serializers.IntegerField(min_value=1)
    location = serializers.CharField(max_length=1000, help_text="Where the host keeps the copy (stage's answer).")


class PrestageParams(serializers.Serializer):
    image = serializers.IntegerField(min_value=1)
    group = serializers.IntegerField(min_value=1, help_text="node group id")


class UploadParams(serializers.Serializer):
    upload = serializers.UUIDField(format="hex_verbose")

    def to_internal_value(self, data):
        return {"upload": str(super().to_internal_value(data)["upload"])}  # kept as JSON


def upload_locks(params):
    return [f"upload:{params['upload']}"]


class ResizeParams(VMParams):
    vcpus = serializers.IntegerField(min_value=1, help_text="The VM's vCPUs from now on.")
    memory_mib = serializers.IntegerField(min_value=16, help_text="Its memory (MiB) from now on.")
