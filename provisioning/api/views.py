"""VM and image REST API. Thin: reads through the ``visible_*`` querysets, writes through services.

Users see the images they may use and their own VMs; staff see and manage everything. VM
actions submit a job and answer ``202`` with its id (watch it at ``/api/v1/jobs/<id>/``).
"""

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import generics, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import access
from accounts.api.permissions import (
    IsAuthenticatedWithTokenScope,
    IsStaffWithTokenScope,
    OperatorOrAuditor,
    role_required,
)
from core.api.negotiation import FormatIsAFilter
from core.errors import Conflict
from drivers.sim import services as sim
from drivers.sim.models import SimFault
from inventory.models import Hypervisor
from provisioning import owned, resizing, revisions, services
from provisioning.api.serializers import (
    ImageRenameSerializer,
    ImageRevisionSerializer,
    ImageSerializer,
    ImageShareSerializer,
    ImageVariantSerializer,
    JobAcceptedSerializer,
    PrestageAcceptedSerializer,
    PrestageSerializer,
    QuotaRuleSerializer,
    SimFaultSerializer,
    VMCaptureSerializer,
    VMCreatedSerializer,
    VMCreateSerializer,
    VMResizeSerializer,
    VMSerializer,
    as_drf,
)
from provisioning.models import VM, Image, ImageRevision, ImageVariant, QuotaRule

#: images: every user reads the ones they may use; image maintainers (of the image's groups) write
ImageMaintainerOrReadOnly = role_required(read=None, write="maintain_images", scope="run")
ImageMaintainer = role_required(read="maintain_images", write="maintain_images", scope="run")
CONFLICT = OpenApiResponse(description="Conflict with the current state")


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: CONFLICT}))
class ImageViewSet(viewsets.ModelViewSet):
    """The image library: users list the images they may use; image maintainers manage their
    groups' images (capture, publish, retire), administrators all."""

    serializer_class = ImageSerializer
    permission_classes = [ImageMaintainerOrReadOnly]
    search_fields = ["name", "os", "description"]
    ordering_fields = ["name", "created"]
    filterset_fields = ["visibility", "active", "platform"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Image.objects.none()
        images = services.visible_images(self.request.user).prefetch_related("groups")
        return services.with_production_variants(images).order_by("name")

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        access.check_image_maintenance(self.request.user, None, data.get("groups", []))
        try:
            serializer.instance = services.create_image(actor=self.request.user, groups=data.pop("groups", []), **data)
        except ValidationError as exc:
            raise as_drf(exc) from None

    def perform_update(self, serializer):
        data = dict(serializer.validated_data)
        groups = data.pop("groups", None)
        access.check_image_maintenance(self.request.user, serializer.instance, groups)
        try:
            services.update_image(serializer.instance, actor=self.request.user, groups=groups, reason="API", **data)
        except ValidationError as exc:
            raise as_drf(exc) from None

    def get_permissions(self):
        if self.action in ("destroy", "rename"):  # an image's owner too (``owned``'s check)
            return [IsAuthenticatedWithTokenScope()]
        return super().get_permissions()

    def perform_destroy(self, instance):
        owned.delete(instance, actor=self.request.user, reason="deleted through the API")

    def _owned_change(self, request, body, verb):
        image = self.get_object()
        body.is_valid(raise_exception=True)
        try:
            verb(image, actor=request.user, reason="API", **body.validated_data)
        except ValidationError as exc:
            raise as_drf(exc) from None
        return Response(self.get_serializer(self.get_queryset().get(pk=image.pk)).data)

    @extend_schema(request=ImageShareSerializer, responses={200: ImageSerializer})
    @action(detail=True, methods=["post"], permission_classes=[ImageMaintainer])
    def share(self, request, pk=None):
        """Restrict the image to groups: a maintainer gives their own groups (the image's others
        kept), to an image they maintain or one a member of their groups owns; none: its owner only."""
        return self._owned_change(request, ImageShareSerializer(data=request.data), owned.share)

    @extend_schema(request=ImageRenameSerializer, responses={200: ImageSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def rename(self, request, pk=None):
        """Rename the image (its owner too), refused while a VM uses it."""
        return self._owned_change(request, ImageRenameSerializer(data=request.data), owned.rename)

    @extend_schema(
        request=PrestageSerializer, responses={202: PrestageAcceptedSerializer, 201: PrestageAcceptedSerializer}
    )
    @action(detail=True, methods=["post"], permission_classes=[OperatorOrAuditor])
    def prestage(self, request, pk=None):
        """Stage the image onto a node group's hosts now (202 + job) or at ``at`` (201 + schedule)."""
        image = self.get_object()
        body = PrestageSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            made = services.prestage(image, body.validated_data["group"], body.validated_data["at"], actor=request.user)
        except ValidationError as exc:
            raise as_drf(exc) from None
        if body.validated_data["at"] is None:
            return Response({"job": made.pk, "schedule": None}, status=status.HTTP_202_ACCEPTED)
        return Response({"job": None, "schedule": made.pk}, status=status.HTTP_201_CREATED)


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: CONFLICT}))
class ImageVariantViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Image variants, one per hypervisor type (image maintainers: their images'). Replace one by deleting it."""

    queryset = ImageVariant.objects.select_related("image").order_by("image__name", "hypervisor_type")
    serializer_class = ImageVariantSerializer
    permission_classes = [ImageMaintainer]
    content_negotiation_class = FormatIsAFilter
    filterset_fields = ["image", "hypervisor_type", "format"]
    ordering_fields = ["image", "hypervisor_type"]

    def get_queryset(self):
        rows = super().get_queryset()
        if access.is_admin(self.request.user):
            return rows
        return rows.filter(image__groups__in=access.maintained_groups(self.request.user)).distinct()

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        access.check_image_maintenance(self.request.user, data["image"])
        try:
            serializer.instance = services.add_variant(data.pop("image"), actor=self.request.user, **data)
        except ValidationError as exc:
            raise as_drf(exc) from None

    def perform_destroy(self, instance):
        access.check_image_maintenance(self.request.user, instance.image)
        services.delete_variant(instance, actor=self.request.user, reason="deleted through the API")


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: CONFLICT}))
class ImageRevisionViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Image revisions: users see those of the images they may use; image maintainers (of the
    image's groups) and administrators add them (``testing``), make one production (the
    roll-back), retire and delete them. New VMs are built from the production revision."""

    serializer_class = ImageRevisionSerializer
    permission_classes = [ImageMaintainerOrReadOnly]
    filterset_fields = ["image", "state"]
    ordering_fields = ["image", "number", "created"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ImageRevision.objects.none()
        visible = services.visible_images(self.request.user).values("pk")
        rows = ImageRevision.objects.filter(image__in=visible).select_related("image", "created_by")
        return rows.prefetch_related("variants").order_by("image__name", "number")

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        access.check_image_maintenance(self.request.user, data["image"])
        try:
            serializer.instance = services.add_revision(
                data["image"],
                actor=self.request.user,
                variants=data["disks"],
                parent=data.get("parent"),
                comment=data["comment"],
                reason="API",
            )
        except ValidationError as exc:
            raise as_drf(exc) from None

    def perform_destroy(self, instance):
        access.check_image_maintenance(self.request.user, instance.image)
        revisions.delete_revision(instance, actor=self.request.user, reason="deleted through the API")

    def _change(self, verb):
        revision = self.get_object()
        access.check_image_maintenance(self.request.user, revision.image)
        verb(revision, actor=self.request.user, reason="API")
        return Response(self.get_serializer(self.get_queryset().get(pk=revision.pk)).data)

    @extend_schema(request=None, responses={200: ImageRevisionSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"], url_path="make-production")
    def make_production(self, request, pk=None):
        """New VMs of the image are built from this revision; the one it replaces becomes testing."""
        return self._change(revisions.make_production)

    @extend_schema(request=None, responses={200: ImageRevisionSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def retire(self, request, pk=None):
        """Retire a revision that is not production (its VMs keep running)."""
        return self._change(revisions.retire)


ACTION_SCHEMA = extend_schema(request=None, responses={202: JobAcceptedSerializer, 409: CONFLICT})


class VMViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Virtual machines: users see and act on their own, staff on all."""

    serializer_class = VMSerializer
    permission_classes = [IsAuthenticatedWithTokenScope]
    filterset_fields = ["state", "image", "host"]
    search_fields = ["name", "address"]
    ordering_fields = ["created", "state", "name"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return VM.objects.none()
        return services.visible_vms(self.request.user).select_related("host", "owner").order_by("-id")

    @extend_schema(request=VMCreateSerializer, responses={202: VMCreatedSerializer})
    def create(self, request):
        """Request a VM: recorded now, built by a ``vm.create`` job (202 with the job id)."""
        serializer = VMCreateSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        try:
            vm, job = services.request_vm(
                actor=request.user, owner=request.user, reason="requested through the API", **data
            )
        except ValidationError as exc:
            raise as_drf(exc) from None
        return Response({"job": job.pk, "vm": vm.pk, "detail": VMSerializer(vm).data}, status=status.HTTP_202_ACCEPTED)

    def _act(self, request, verb, **params):
        vm = self.get_object()
        try:
            job = services.submit_action(vm, verb, actor=request.user, reason=f"{verb} through the API", **params)
        except ValidationError as exc:
            raise as_drf(exc) from None
        return Response({"job": job.pk, "vm": vm.pk}, status=status.HTTP_202_ACCEPTED)

    @ACTION_SCHEMA
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        return self._act(request, "start")

    @ACTION_SCHEMA
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        return self._act(request, "stop")

    @ACTION_SCHEMA
    @action(detail=True, methods=["post"])
    def suspend(self, request, pk=None):
        return self._act(request, "suspend")

    @ACTION_SCHEMA
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._act(request, "resume")

    @ACTION_SCHEMA
    @action(detail=True, methods=["post"], url_path="destroy", url_name="destroy")
    def destroy_vm(self, request, pk=None):
        return self._act(request, "destroy")

    @extend_schema(request=VMCaptureSerializer, responses={202: JobAcceptedSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def capture(self, request, pk=None):
        """Capture the VM's disk as a new image (the VM is stopped first and left stopped)."""
        body = VMCaptureSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._act(request, "capture", **body.validated_data)

    @extend_schema(
        request=VMResizeSerializer,
        responses={
            202: JobAcceptedSerializer,
            400: OpenApiResponse(description="A size its image does not allow, or no size given"),
            403: OpenApiResponse(description="Only operators resize VMs"),
            409: CONFLICT,
        },
    )
    @action(detail=True, methods=["post"], permission_classes=[OperatorOrAuditor])
    def resize(self, request, pk=None):
        """Change the VM's vCPUs and memory (operators): its claim on its host first, for the rest
        of its window, then its definition. The job's result says when it applies: ``now`` (a
        stopped VM) or ``next boot``. A running VM may only grow; its disk keeps its size."""
        body = VMResizeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        vm = generics.get_object_or_404(services.operable_vms(request.user), pk=pk)  # operators: any user's VM
        try:
            job = resizing.resize(vm, actor=request.user, reason="resize through the API", **body.validated_data)
        except ValidationError as exc:
            raise as_drf(exc) from None
        return Response({"job": job.pk, "vm": vm.pk}, status=status.HTTP_202_ACCEPTED)


class QuotaRuleViewSet(viewsets.ModelViewSet):
    """Quota rules (staff only): limits per group and image on reservations and VMs held at once."""

    queryset = QuotaRule.objects.select_related("group", "image").order_by("name")
    serializer_class = QuotaRuleSerializer
    permission_classes = [IsStaffWithTokenScope]


class SimFaultView(APIView):
    """Faults injected into a simulated hypervisor (staff only)."""

    permission_classes = [IsStaffWithTokenScope]

    def _host(self, pk):
        hv = get_object_or_404(Hypervisor, pk=pk)
        if hv.driver != Hypervisor.Driver.SIM:
            raise Conflict(f"{hv.name} is not a simulated hypervisor")
        from drivers.sim.driver import SimDriver

        return SimDriver(hv.connection_uri).host_name

    @extend_schema(responses={200: SimFaultSerializer(many=True), 409: CONFLICT})
    def get(self, request, pk):
        name = self._host(pk)
        return Response(SimFaultSerializer(SimFault.objects.filter(host__name=name), many=True).data)

    @extend_schema(request=SimFaultSerializer, responses={201: SimFaultSerializer, 409: CONFLICT})
    def post(self, request, pk):
        name = self._host(pk)
        serializer = SimFaultSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            fault = sim.set_fault(
                name, data["step"], data["mode"], data.get("seconds"), actor=request.user, reason="set through the API"
            )
        except ValidationError as exc:
            raise as_drf(exc) from None
        return Response(SimFaultSerializer(fault).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[OpenApiParameter("step", str, description="Clear only this step's fault.")],
        responses={204: None, 409: CONFLICT},
    )
    def delete(self, request, pk):
        name = self._host(pk)
        sim.clear_fault(
            name, request.query_params.get("step") or None, actor=request.user, reason="cleared through the API"
        )
        return Response(status=status.HTTP_204_NO_CONTENT)
