"""Environment templates' REST API. Thin: reads through ``services.visible_templates``, every
write (and its permission check) through the services."""

from django.core.exceptions import PermissionDenied, ValidationError
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.api.permissions import IsAuthenticatedWithTokenScope
from environments import services
from environments.api.serializers import ShareSerializer, TemplateSerializer
from environments.models import EnvironmentTemplate
from inventory.api.serializers import as_drf

FORBIDDEN = OpenApiResponse(description="Not yours to change")


@extend_schema_view(
    update=extend_schema(responses={200: TemplateSerializer, 403: FORBIDDEN}),
    partial_update=extend_schema(responses={200: TemplateSerializer, 403: FORBIDDEN}),
    destroy=extend_schema(responses={204: None, 403: FORBIDDEN}),
)
class TemplateViewSet(viewsets.ModelViewSet):
    """Environment templates: several connected VMs reserved as one. Users list the templates
    they may use and write their own; sharing follows the images' rules."""

    serializer_class = TemplateSerializer
    permission_classes = [IsAuthenticatedWithTokenScope]
    search_fields = ["name", "description"]
    ordering_fields = ["name", "created"]
    filterset_fields = ["visibility", "active"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return EnvironmentTemplate.objects.none()
        rows = services.visible_templates(self.request.user)
        return rows.prefetch_related("members__networks", "members__image", "networks", "groups").order_by("name")

    def _saved(self, serializer, verb, *args):
        data = dict(serializer.validated_data)
        serializer.instance = _answered(verb, *args, actor=self.request.user, reason="API", **data)

    def perform_create(self, serializer):
        self._saved(serializer, services.create_template)

    def perform_update(self, serializer):
        self._saved(serializer, services.update_template, serializer.instance)

    def perform_destroy(self, instance):
        _answered(services.delete_template, instance, actor=self.request.user, reason="deleted through the API")

    @extend_schema(request=ShareSerializer, responses={200: TemplateSerializer, 403: FORBIDDEN})
    @action(detail=True, methods=["post"])
    def share(self, request, pk=None):
        """Restrict the template to groups: an image maintainer gives their own groups (its
        others kept); none: its owner only."""
        template = self.get_object()
        body = ShareSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        _answered(services.share_template, template, body.validated_data["groups"], actor=request.user, reason="API")
        return Response(self.get_serializer(self.get_queryset().get(pk=template.pk)).data)


def _answered(verb, *args, **kwargs):
    """``verb``'s result; its refusals as the API's errors, with the service's own words (DRF
    would answer a Django PermissionDenied with a message of its own)."""
    try:
        return verb(*args, **kwargs)
    except ValidationError as exc:
        raise as_drf(exc) from None
    except PermissionDenied as exc:
        raise exceptions.PermissionDenied(str(exc) or None) from None
