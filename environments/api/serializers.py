from django.contrib.auth.models import Group
from rest_framework import serializers

from core.api.serializers import RefuseUnknownFields
from environments.models import MAX_COUNT, MAX_DISK_GIB, MAX_MEMORY_MIB, MAX_VCPUS, EnvironmentTemplate
from provisioning.models import Image

MAX_ID = 2**63 - 1
LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class NetworkSerializer(RefuseUnknownFields, serializers.Serializer):
    name = serializers.RegexField(LABEL, max_length=63, help_text="A DNS label, unique in the template.")
    cidr = serializers.CharField(
        max_length=18,
        required=False,
        allow_blank=True,
        default="",
        help_text="A private IPv4 range, /16 to /29 (blank: a free one is picked).",
    )


class MemberSerializer(RefuseUnknownFields, serializers.Serializer):
    name = serializers.RegexField(LABEL, max_length=63, help_text="Its hostname (a DNS label), unique in the template.")
    # Null only on read: a member whose image the reader may not see (see ``_sees``).
    image = serializers.IntegerField(
        min_value=1, max_value=MAX_ID, allow_null=True, help_text="An image the owner may use (its id)."
    )
    image_name = serializers.CharField(source="image.name", read_only=True, allow_null=True)
    revision = serializers.IntegerField(
        min_value=1,
        max_value=2**31 - 1,
        required=False,
        allow_null=True,
        default=None,
        help_text="The image's revision (its number) to build from; blank: the production one. "
        "A revision under test: its image's maintainers only.",
    )
    count = serializers.IntegerField(
        min_value=1, max_value=MAX_COUNT, required=False, default=1, help_text="More than one: name-1 … name-N."
    )
    vcpus = serializers.IntegerField(min_value=1, max_value=MAX_VCPUS, required=False, allow_null=True, default=None)
    memory_mib = serializers.IntegerField(
        min_value=16, max_value=MAX_MEMORY_MIB, required=False, allow_null=True, default=None
    )
    disk_gib = serializers.IntegerField(
        min_value=0,
        max_value=MAX_DISK_GIB,
        required=False,
        allow_null=True,
        default=None,
        help_text="Sizes left out are the image's defaults.",
    )
    entry = serializers.BooleanField(
        required=False, default=False, help_text="The machine its user connects to: exactly one, of count 1."
    )
    networks = serializers.ListField(
        child=serializers.RegexField(LABEL, max_length=63),
        max_length=32,
        required=False,
        default=list,
        help_text="Names of the template's networks it is attached to.",
    )

    def validate_image(self, value):
        if value is None:
            raise serializers.ValidationError("Choose an image.")
        return value

    def to_representation(self, member):
        fields = ("name", "count", "vcpus", "memory_mib", "disk_gib", "entry")
        shown = self._sees(member.image_id)
        return {
            **{name: getattr(member, name) for name in fields},
            "image": member.image_id if shown else None,
            "image_name": member.image.name if shown else None,
            "revision": member.revision.number if member.revision_id and shown else None,
            "networks": sorted(n.name for n in member.networks.all()),
        }

    def _sees(self, image_id):
        """May the reader (the request's user, or ``viewer``; neither: the CLI's administrator)
        see the image? A member's image they may not is left out (null), whoever shared the
        template with them."""
        context = self.context
        request = context.get("request")
        user = context.get("viewer", getattr(request, "user", None))
        if user is None:
            return True
        seen = context.setdefault("seen_images", {})
        if image_id not in seen:
            seen[image_id] = Image.objects.visible_to(user).filter(pk=image_id).exists()
        return seen[image_id]


class TemplateSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    members = MemberSerializer(many=True, max_length=64, help_text="Its machines' kinds.")
    networks = NetworkSerializer(many=True, max_length=32, required=False, default=list)
    machines = serializers.SerializerMethodField()

    class Meta:
        model = EnvironmentTemplate
        fields = [
            "id",
            "name",
            "description",
            "owner",
            "visibility",
            "groups",
            "active",
            "members",
            "networks",
            "machines",
            "created",
            "updated",
        ]
        read_only_fields = ["owner", "groups", "created", "updated"]
        extra_kwargs = {"visibility": {"help_text": "public: administrators only; share with groups through share/."}}

    def get_machines(self, template) -> int:
        """How many VMs it stands for."""
        return sum(m.count for m in template.members.all())


class ShareSerializer(RefuseUnknownFields, serializers.Serializer):
    groups = serializers.PrimaryKeyRelatedField(
        queryset=Group.objects.all(), many=True, help_text="The groups that may use it (yours; none: its owner only)."
    )
