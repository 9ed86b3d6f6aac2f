"""``POST /api/v1/hypervisors/discover/`` (staff): discovery through the REST API.

Synchronous by choice: a discovery is a few round trips per host, seconds even for a large
vCenter, and the caller wants the preview in the answer. A dry run (the default) answers 200
with the preview; a commit answers 201 with what was created or updated, or 400 with the
per-host report when a host was rejected (then nothing was written). A hypervisor that cannot
be reached answers 502, one that refuses the credentials (or a bad URI) 400; nothing is written
in either case. Passwords are accepted, never returned.
"""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.api.permissions import OperatorOrAuditor
from core.api.errors import error_body
from core.api.serializers import RefuseUnknownFields
from inventory.discovery import services
from inventory.models import Hypervisor


class DiscoverRequestSerializer(RefuseUnknownFields, serializers.Serializer):
    # The inventory's choices (one enum in the schema); simulated hosts are made, not discovered.
    driver = serializers.ChoiceField(choices=Hypervisor.Driver.choices, help_text="vmware (vCenter/ESXi) or libvirt.")
    uri = serializers.CharField(
        required=False, max_length=500, help_text="A vCenter URL (https://vcenter/sdk) or one libvirt URI."
    )
    uris = serializers.ListField(
        child=serializers.CharField(max_length=500), required=False, max_length=500, help_text="Several libvirt URIs."
    )
    credential = serializers.CharField(required=False, max_length=100, help_text="An existing credential's name.")
    username = serializers.CharField(required=False, allow_blank=True, max_length=150)
    password = serializers.CharField(
        required=False,
        allow_blank=True,
        write_only=True,
        max_length=500,
        style={"input_type": "password"},
        help_text="Stored as a credential on commit; never returned.",
    )
    group = serializers.CharField(required=False, max_length=100, help_text="Node group for the hosts.")
    commit = serializers.BooleanField(default=False, help_text="Register or update the hosts (default: preview).")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")

    def validate_driver(self, value):
        if value not in services.DRIVERS:
            raise serializers.ValidationError(f"{value} hosts are not discovered (use {' or '.join(services.DRIVERS)})")
        return value

    def validate(self, attrs):
        uris = [*([attrs["uri"]] if attrs.get("uri") else []), *attrs.get("uris", [])]
        if not uris:
            raise serializers.ValidationError({"uri": ["required"]})
        attrs["uris"] = uris
        return attrs


class DiscoveredHostSerializer(serializers.Serializer):
    action = serializers.CharField(allow_null=True, help_text="create, update, unchanged or reject")
    id = serializers.IntegerField(allow_null=True)
    name = serializers.CharField()
    address = serializers.CharField()
    uri = serializers.CharField()
    group = serializers.CharField(allow_null=True)
    cpus = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    disk_gib = serializers.IntegerField()
    version = serializers.CharField()
    vms = serializers.IntegerField()
    errors = serializers.ListField(child=serializers.CharField())


class DiscoveryResultSerializer(serializers.Serializer):
    driver = serializers.CharField()
    dry_run = serializers.BooleanField()
    committed = serializers.BooleanField()
    ok = serializers.BooleanField()
    summary = serializers.CharField()
    totals = serializers.DictField(child=serializers.IntegerField())
    errors = serializers.ListField(child=serializers.CharField())
    credential = serializers.CharField(allow_null=True, help_text="The credential's name (never its secret).")
    credential_created = serializers.BooleanField()
    hosts = DiscoveredHostSerializer(many=True)


class DiscoverView(APIView):
    """Find hypervisors through their own API; preview, or register/update them via the bulk import."""

    permission_classes = [OperatorOrAuditor]

    @extend_schema(
        request=DiscoverRequestSerializer,
        responses={
            200: DiscoveryResultSerializer,
            201: DiscoveryResultSerializer,
            400: OpenApiResponse(description="Bad input, refused credentials or a rejected host; nothing written"),
            502: OpenApiResponse(description="The hypervisor could not be reached; nothing written"),
        },
    )
    def post(self, request):
        body = DiscoverRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        args = body.validated_data
        try:
            found = services.discover(
                args["driver"],
                args["uris"],
                actor=request.user,
                username=args.get("username", ""),
                password=args.get("password", ""),
                credential=args.get("credential"),
                group=args.get("group"),
                commit=args["commit"],
                reason=args["reason"] or "discovery through the API",
            )
        except services.DiscoveryError as exc:
            code, kind = (400, "invalid") if exc.permanent else (502, "unreachable")
            return Response(error_body(code, kind, f"discovery failed, nothing was written: {exc}"), status=code)
        result = DiscoveryResultSerializer(found.as_dict()).data
        if not found.report.ok:
            body = error_body(
                400,
                "invalid",
                "a discovered host was rejected; nothing was written",
                {"hosts": found.report.messages()[:200]},
            )
            return Response({**body, "report": result}, status=status.HTTP_400_BAD_REQUEST)
        return Response(result, status=status.HTTP_201_CREATED if found.committed else status.HTTP_200_OK)
