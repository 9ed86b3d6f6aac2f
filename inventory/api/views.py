"""Inventory REST API (administrators only). Thin: every write is a service call."""

import json

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Count
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import renderers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ParseError
from rest_framework.response import Response

from accounts.api.permissions import OperatorOrAuditor
from core import changelog
from core.api.errors import error_body
from core.api.exceptions import TooLarge
from core.api.parsers import FormParser, ImportJSONParser, MultiPartParser
from inventory import formats, power, services
from inventory.api import filters
from inventory.api.serializers import (
    BladeCenterSerializer,
    CredentialSerializer,
    HypervisorSerializer,
    ImportFailureSerializer,
    ImportReportSerializer,
    ImportRequestSerializer,
    NodeGroupSerializer,
    ObjectChangeSerializer,
    PowerStateSerializer,
    RegistrationFailureSerializer,
    RegistrationRequestSerializer,
    RegistrationSerializer,
    ScheduleSerializer,
    SlotSerializer,
    StateChangeSerializer,
    as_drf,
)
from inventory.models import BladeCenter, Credential, Hypervisor, NodeGroup


class InventoryViewSet(viewsets.ModelViewSet):
    """CRUD through the serializers' service calls; delete through ``delete_service``."""

    permission_classes = [OperatorOrAuditor]
    delete_service = None

    def perform_destroy(self, instance):
        type(self).delete_service(instance, actor=self.request.user, reason="deleted through the API")

    @extend_schema(responses=ObjectChangeSerializer(many=True), filters=False)
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def changes(self, request, pk=None):
        """The change log of this object: who changed what, when and why (newest first, last 100)."""
        return Response(ObjectChangeSerializer(changelog.history(self.get_object()), many=True).data)


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: OpenApiResponse(description="Still in use")}))
class CredentialViewSet(InventoryViewSet):
    """Logins the drivers use. The secret is write-only: no response ever contains it."""

    queryset = Credential.objects.all()
    serializer_class = CredentialSerializer
    filterset_class = filters.CredentialFilterSet
    search_fields = ["name", "username"]
    ordering_fields = ["name", "created"]
    delete_service = staticmethod(services.delete_credential)


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: OpenApiResponse(description="Still in use")}))
class NodeGroupViewSet(InventoryViewSet):
    queryset = NodeGroup.objects.annotate(hypervisor_count=Count("hypervisors")).order_by("name")
    serializer_class = NodeGroupSerializer
    filterset_class = filters.NodeGroupFilterSet
    search_fields = ["name", "description"]
    ordering_fields = ["name", "created"]
    delete_service = staticmethod(services.delete_node_group)


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: OpenApiResponse(description="Still in use")}))
class BladeCenterViewSet(InventoryViewSet):
    queryset = BladeCenter.objects.annotate(hypervisor_count=Count("hypervisors")).order_by("name")
    serializer_class = BladeCenterSerializer
    filterset_class = filters.BladeCenterFilterSet
    search_fields = ["name", "site", "model"]
    ordering_fields = ["name", "site", "created"]
    delete_service = staticmethod(services.delete_blade_center)

    @extend_schema(responses=SlotSerializer(many=True), filters=False)
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def slots(self, request, pk=None):
        """Every slot of the chassis, with the hypervisor in it (id null: empty)."""
        return Response(SlotSerializer(services.chassis_slots(self.get_object()), many=True).data)

    @extend_schema(
        request=RegistrationRequestSerializer,
        responses={200: RegistrationSerializer, 201: RegistrationSerializer, 400: RegistrationFailureSerializer},
        filters=False,
    )
    @action(detail=False, methods=["post"], filter_backends=[])
    def register(self, request):
        """Register a chassis and one hypervisor per slot of a range, all at once or not at all.

        With ``dry_run`` the answer is the preview (200) and nothing is written; otherwise 201
        with the chassis and hosts, or 400 with the per-row report when a row is rejected.
        """
        serializer = RegistrationRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        spec = dict(serializer.validated_data)
        dry_run = spec.pop("dry_run")
        try:
            registration = services.register_blade_center(spec, actor=request.user, dry_run=dry_run)
        except DjangoValidationError as exc:
            raise as_drf(exc) from None
        report = registration.report
        chassis = registration.blade_center
        data = {
            "blade_center": {"id": chassis.pk, **{f: getattr(chassis, f) for f in services.CHASSIS_FIELDS}},
            "hosts": registration.hosts,
            "report": report.as_dict(),
        }
        if not report.ok:
            return _report_failure(report, "the registration was refused; nothing was written")
        return Response(RegistrationSerializer(data).data, status=status.HTTP_200_OK if dry_run else 201)


def _report_failure(report, what):
    messages = report.messages()
    fields = {"rows": messages[:200]} if messages else None
    body = error_body(400, "invalid", f"{what}: {messages[0] if messages else 'see the report'}", fields)
    body["report"] = report.as_dict()
    return Response(body, status=status.HTTP_400_BAD_REQUEST)


class FileRenderer(renderers.BaseRenderer):
    """Export bodies are bytes made by inventory.formats; this only names the format."""

    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, bytes) else b""


class CSVRenderer(FileRenderer):
    media_type, format = "text/csv", "csv"


class XLSXRenderer(FileRenderer):
    media_type, format = formats.CONTENT_TYPES["xlsx"], "xlsx"


class YAMLRenderer(FileRenderer):
    media_type, format = "application/yaml", "yaml"


EXPORT_RESPONSES = {
    (200, "text/csv"): OpenApiTypes.BINARY,
    (200, formats.CONTENT_TYPES["xlsx"]): OpenApiTypes.BINARY,
    (200, "application/json"): {"type": "array", "items": {"type": "object", "additionalProperties": True}},
    (200, "application/yaml"): OpenApiTypes.BINARY,
}


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: OpenApiResponse(description="VMs run on it")}))
class HypervisorViewSet(InventoryViewSet):
    """Hypervisors. Filter by group, blade_center, state, driver, tag (repeat for all-of)."""

    queryset = Hypervisor.objects.select_related("credential", "blade_center", "group").prefetch_related("tags")
    serializer_class = HypervisorSerializer
    filterset_class = filters.HypervisorFilterSet
    search_fields = ["name", "address", "state_reason"]
    ordering_fields = ["name", "cpus", "memory_mib", "disk_gib", "state", "slot", "created", "updated"]
    delete_service = staticmethod(services.delete_hypervisor)

    def finalize_response(self, request, response, *args, **kwargs):
        # Errors of the export are JSON like every other error, whatever format was asked for.
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = renderers.JSONRenderer()
            request.accepted_media_type = request.accepted_renderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(request=StateChangeSerializer, responses=HypervisorSerializer, filters=False)
    @action(detail=True, methods=["post"], filter_backends=[])
    def state(self, request, pk=None):
        """Set online / drained (no new VMs) / offline (nothing); the reason is kept in the change log."""
        hypervisor = self.get_object()
        serializer = StateChangeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            services.set_state(hypervisor, actor=request.user, **serializer.validated_data)
        except DjangoValidationError as exc:
            raise as_drf(exc) from None
        return Response(HypervisorSerializer(self.get_queryset().get(pk=hypervisor.pk)).data)

    @extend_schema(request=ScheduleSerializer, responses=HypervisorSerializer, filters=False)
    @action(detail=True, methods=["post", "delete"], filter_backends=[])
    def schedule(self, request, pk=None):
        """POST: go drained/offline once the current reservations end (``scheduled_until``: that
        moment; until then nothing that lasts longer is placed here). DELETE: cancel it."""
        hypervisor = self.get_object()
        if request.method == "DELETE":
            services.cancel_schedule(hypervisor, "canceled through the API", actor=request.user)
        else:
            serializer = ScheduleSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            try:
                services.schedule_state(hypervisor, actor=request.user, **serializer.validated_data)
            except DjangoValidationError as exc:
                raise as_drf(exc) from None
        return Response(HypervisorSerializer(self.get_queryset().get(pk=hypervisor.pk)).data)

    @extend_schema(
        responses={
            200: PowerStateSerializer,
            409: OpenApiResponse(description="no BMC"),
            502: OpenApiResponse(description="the BMC refused the credential or did not answer"),
        },
        filters=False,
    )
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def power(self, request, pk=None):
        """Read the host's power state from its BMC now (on / off / unknown) and store it.
        To change it, submit the ``node.power_on`` / ``node.power_off`` job (``/api/v1/jobs/``)."""
        hypervisor = self.get_object()
        power.read_power(hypervisor, actor=request.user)
        return Response(PowerStateSerializer(Hypervisor.objects.get(pk=hypervisor.pk)).data)

    @extend_schema(
        request={"multipart/form-data": ImportRequestSerializer, "application/json": ImportRequestSerializer},
        responses={200: ImportReportSerializer, 400: ImportFailureSerializer},
        filters=False,
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="import",
        filter_backends=[],
        parser_classes=[MultiPartParser, FormParser, ImportJSONParser],
    )
    def import_(self, request):
        """Import hypervisors from a file (or rows): all rows or none.

        Answers the per-row report: what each row creates, updates, leaves unchanged or why it
        is rejected (``Row 12 memory_mib: must be a positive integer``). With ``dry_run``
        nothing is written (200 whatever the rows say); otherwise 200 when committed, 400
        with the report when anything was rejected (and nothing was written).
        """
        try:
            payload = request.data
        except RequestDataTooBig:
            raise TooLarge("the request body is too large: upload the file as multipart/form-data") from None
        serializer = ImportRequestSerializer(data=payload)
        serializer.is_valid(raise_exception=True)
        args = serializer.validated_data
        upload = args.get("file")
        if upload is not None:
            try:
                formats.check_size(upload.size)
            except formats.FileError as exc:
                raise TooLarge(str(exc)) from None
        if upload is not None:
            data, name = upload.read(), upload.name
        elif args.get("rows") is not None:
            data, name = json.dumps(args["rows"]).encode(), "rows"
        else:
            data, name = args["data"].encode(), "request body"
        report = services.import_hypervisors(
            data, args["format"], actor=request.user, dry_run=args["dry_run"], file_name=name[:200]
        )
        if not report.dry_run and not report.ok:
            return _report_failure(report, "the import was refused; nothing was written")
        return Response(ImportReportSerializer(report.as_dict()).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "format", OpenApiTypes.STR, enum=list(formats.FORMATS), description="File format (default csv)."
            )
        ],
        responses=EXPORT_RESPONSES,
        filters=True,
    )
    @action(
        detail=False,
        methods=["get"],
        pagination_class=None,
        renderer_classes=[CSVRenderer, renderers.JSONRenderer, XLSXRenderer, YAMLRenderer],
    )
    def export(self, request):
        """The (filtered) hypervisors as a file that imports back unchanged."""
        fmt = request.accepted_renderer.format
        if fmt not in formats.FORMATS:
            raise ParseError(f"unknown format {fmt!r}")
        queryset = self.filter_queryset(self.get_queryset()).prefetch_related(None)
        body = services.export_hypervisors(fmt, queryset)
        response = HttpResponse(body, content_type=formats.CONTENT_TYPES[fmt])
        response["Content-Disposition"] = f'attachment; filename="hypervisors.{fmt}"'
        return response
