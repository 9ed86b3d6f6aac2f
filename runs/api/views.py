"""Batch runs REST API. Thin: reads through ``services.visible`` (another user's run is a 404,
never a 403 that would confirm it exists; staff see all), writes through the services.

``POST /runs/`` takes JSON, or a multipart form whose files named ``input:<path>`` are the
input files (put at ``<path>`` under the work directory); it answers 202 with the run and its
job. ``/runs/<id>/log/?after=<seq>`` pages the output; ``/runs/<id>/artifacts/`` lists the
files and ``/runs/<id>/artifacts/<file id>/`` downloads one.
"""

from django.core.exceptions import ValidationError
from django.http import FileResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.reverse import reverse

from accounts.api.permissions import IsAuthenticatedWithTokenScope
from inventory.api.serializers import as_drf
from runs import services
from runs.api.serializers import (
    RunAcceptedSerializer,
    RunCreateSerializer,
    RunFileSerializer,
    RunLogSerializer,
    RunSerializer,
    log_page,
)
from runs.models import Run, RunFile

CONFLICT = OpenApiResponse(description="Conflict with the current state")
LOG_PAGE = 200


class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Batch runs: submit, list your own (staff: all), read the log and artifacts, cancel."""

    serializer_class = RunSerializer
    permission_classes = [IsAuthenticatedWithTokenScope]
    filterset_fields = ["state", "image", "priority"]
    ordering_fields = ["created", "state"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Run.objects.none()
        return services.visible(self.request.user).select_related("owner", "image", "vm").order_by("-id")

    @extend_schema(request=RunCreateSerializer, responses={202: RunAcceptedSerializer})
    def create(self, request):
        """Submit a run: 202 with the run and its job."""
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        inputs = [(name[len("input:") :], f) for name, f in request.FILES.items() if name.startswith("input:")]
        others = sorted(name for name in request.FILES if not name.startswith("input:"))
        if others:
            raise serializers.ValidationError({name: ["files are named input:<path>"] for name in others})
        try:
            run = services.submit(actor=request.user, owner=request.user, inputs=inputs, **body.validated_data)
        except ValidationError as exc:
            raise as_drf(exc) from None
        url = reverse("job-detail", args=[run.job], request=request) if run.job else None
        body = {"run": RunSerializer(run, context={"request": request}).data, "job": run.job, "job_url": url}
        return Response(body, status=status.HTTP_202_ACCEPTED, headers={"Location": body["run"]["log_url"]})

    @extend_schema(
        parameters=[
            OpenApiParameter("after", OpenApiTypes.INT, description="The last seq read (-1: from the start)."),
            OpenApiParameter("limit", OpenApiTypes.INT, description=f"Chunks per page (at most {LOG_PAGE})."),
        ],
        responses={200: RunLogSerializer},
    )
    @action(detail=True, methods=["get"])
    def log(self, request, pk=None):
        """The output from after= on, in chunks as printed, with the run's state."""
        run = self.get_object()
        try:
            after = int(request.query_params.get("after", -1))
            limit = min(LOG_PAGE, max(1, int(request.query_params.get("limit", LOG_PAGE))))
        except ValueError:
            raise serializers.ValidationError({"after": ["a whole number"]}) from None
        return Response(RunLogSerializer(log_page(run, after, limit)).data)

    @extend_schema(responses={200: RunFileSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def artifacts(self, request, pk=None):
        """The artifacts the run left (and its input files)."""
        run = self.get_object()
        return Response(RunFileSerializer(run.files.all(), many=True, context={"request": request}).data)

    @extend_schema(
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            410: OpenApiResponse(description="Removed by retention (RUNS_RETENTION_DAYS)"),
        }
    )
    @action(detail=True, methods=["get"], url_path=r"artifacts/(?P<file_id>\d+)", url_name="artifact")
    def artifact(self, request, pk=None, file_id=None):
        """Download one file of the run."""
        run = self.get_object()
        if run.files_removed:  # not a 404: the run is there, its files are not any more
            return Response({"detail": services.RETENTION_NOTE}, status=status.HTTP_410_GONE)
        item = get_object_or_404(RunFile, run=run, pk=file_id)
        handle = services.storage().open(item.stored, "rb")
        return FileResponse(handle, as_attachment=True, filename=item.path.rsplit("/", 1)[-1])

    @extend_schema(request=None, responses={202: RunSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def discard(self, request, pk=None):
        """Destroy a failed run's kept VM now (captured first if the run asked): 202, a job does it."""
        run = get_object_or_404(services.changeable(request.user), pk=self.get_object().pk)
        services.discard_kept(run, actor=request.user, reason="discarded through the API")
        return Response(RunSerializer(run, context={"request": request}).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: RunSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel: a queued run ends at once; a running one stops and its VM is destroyed."""
        run = get_object_or_404(services.changeable(request.user), pk=self.get_object().pk)
        run = services.cancel(run, actor=request.user, reason="canceled through the API")
        return Response(RunSerializer(run, context={"request": request}).data)
