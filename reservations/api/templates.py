"""An image's template through the API: start it, publish it as a revision, discard it, and
reserve a revision to test it (``reservations.templates``). For the image's maintainers and
the administrators; an image the user may not see is a 404, one they may not change a 403.
Publishing answers ``202`` with the capture job (watch it at ``/api/v1/jobs/<id>/``)."""

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.api.permissions import role_required
from inventory.api.serializers import as_drf
from provisioning import services as vms
from provisioning.models import ImageRevision
from reservations import services
from reservations.api.serializers import (
    ReservationAcceptedSerializer,
    ReservationSerializer,
    RevisionTestSerializer,
    TemplatePublishedSerializer,
    TemplatePublishSerializer,
    TemplateStartSerializer,
    job_url,
)
from reservations.api.views import CONFLICT, _accepted

ImageMaintainer = role_required(read="maintain_images", write="maintain_images", scope="run")


def _image(request, pk):
    return get_object_or_404(vms.visible_images(request.user), pk=pk)


def _template(image):
    template = services.open_template(image)
    if template is None:
        raise as_drf(ValidationError({"template": [f"{image.name} has no template: start one first"]}))
    return template


class TemplateView(APIView):
    """The image's open template (404: none), or start one (202 with its build job)."""

    permission_classes = [ImageMaintainer]

    @extend_schema(responses={200: ReservationSerializer})
    def get(self, request, pk):
        template = services.open_template(_image(request, pk))
        if template is None or not services.visible(request.user).filter(pk=template.pk).exists():
            return Response({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
        return Response(ReservationSerializer(template, context={"request": request}).data)

    @extend_schema(request=TemplateStartSerializer, responses={202: ReservationAcceptedSerializer, 409: CONFLICT})
    def post(self, request, pk):
        image = _image(request, pk)
        body = TemplateStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        number = body.validated_data["revision"]
        revision = get_object_or_404(image.revisions, number=number) if number else None
        try:
            template = services.start_template(
                image, revision=revision, ssh_key=body.validated_data["ssh_key"], actor=request.user
            )
        except ValidationError as exc:
            raise as_drf(exc) from None
        return _accepted(template, services.build_job(template), request)


class TemplatePublishView(APIView):
    """Capture the template as the image's next revision (testing, or production); 202 + job."""

    permission_classes = [ImageMaintainer]

    @extend_schema(request=TemplatePublishSerializer, responses={202: TemplatePublishedSerializer, 409: CONFLICT})
    def post(self, request, pk):
        template = _template(_image(request, pk))
        body = TemplatePublishSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            job = services.publish(template, actor=request.user, **body.validated_data)
        except ValidationError as exc:
            raise as_drf(exc) from None
        url = job_url(job, request)
        return Response({"job": job.pk, "job_url": url}, status=status.HTTP_202_ACCEPTED, headers={"Location": url})


class TemplateDiscardView(APIView):
    """End the template without a revision (202 with the teardown job)."""

    permission_classes = [ImageMaintainer]

    @extend_schema(request=None, responses={202: ReservationAcceptedSerializer, 409: CONFLICT})
    def post(self, request, pk):
        template = _template(_image(request, pk))
        job = services.discard(template, actor=request.user)
        template.refresh_from_db()
        return _accepted(template, job, request, created=False)


class RevisionTestView(APIView):
    """Reserve the revision as a student would (quotas counted), its VM built from it."""

    permission_classes = [ImageMaintainer]

    @extend_schema(
        request=RevisionTestSerializer,
        responses={202: ReservationAcceptedSerializer, 400: OpenApiResponse(description="Refused")},
    )
    def post(self, request, pk):
        visible = vms.visible_images(request.user).values("pk")
        revision = get_object_or_404(ImageRevision.objects.select_related("image"), pk=pk, image__in=visible)
        body = RevisionTestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        minutes = body.validated_data["duration"]
        try:
            reservation = services.test_revision(
                revision.image, revision, duration=timedelta(minutes=minutes), actor=request.user
            )
        except ValidationError as exc:
            raise as_drf(exc) from None
        return _accepted(reservation, services.build_job(reservation), request)
