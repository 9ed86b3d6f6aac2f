"""Notifications API: each user's own preferences; webhooks and the delivery logs for staff."""

from django.core.exceptions import ValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import access
from accounts.api.permissions import AuditorOrAdmin, IsAuthenticatedWithTokenScope
from inventory.api.serializers import as_drf
from notifications import services
from notifications.api.serializers import (
    NotificationSerializer,
    PreferenceSerializer,
    WebhookDeliverySerializer,
    WebhookSerializer,
)
from notifications.models import KIND_NAMES, Notification, Webhook, WebhookDelivery


class PreferenceView(APIView):
    """Your notification preferences: the kinds of e-mail you turned off."""

    permission_classes = [IsAuthenticatedWithTokenScope]

    @extend_schema(responses=PreferenceSerializer)
    def get(self, request):
        return Response({"disabled": services.disabled_kinds(request.user), "kinds": KIND_NAMES})

    @extend_schema(request=PreferenceSerializer, responses=PreferenceSerializer)
    def put(self, request):
        body = PreferenceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            pref = services.set_preferences(request.user, body.validated_data["disabled"], actor=request.user)
        except ValidationError as exc:
            raise as_drf(exc) from None
        return Response({"disabled": pref.disabled, "kinds": KIND_NAMES})


class WebhookViewSet(viewsets.ModelViewSet):
    """Webhooks (staff): a signed POST of each event of the chosen kinds to a URL."""

    serializer_class = WebhookSerializer
    permission_classes = [AuditorOrAdmin]
    queryset = Webhook.objects.all()
    http_method_names = ["get", "post", "put", "patch", "delete", "head", "options"]

    def perform_destroy(self, instance):
        services.delete_webhook(instance, actor=self.request.user)


class WebhookDeliveryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The webhook delivery log (staff): each delivery's state, answer, time and last error."""

    serializer_class = WebhookDeliverySerializer
    permission_classes = [AuditorOrAdmin]
    queryset = WebhookDelivery.objects.all()
    filterset_fields = ["webhook", "state", "event_kind"]


class NotificationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Mail notifications (staff: all; a user: their own), with state and last error."""

    serializer_class = NotificationSerializer
    permission_classes = [IsAuthenticatedWithTokenScope]
    filterset_fields = ["kind", "state"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Notification.objects.none()
        rows = Notification.objects.all()
        return rows if access.can(self.request.user, "see_all") else rows.filter(user=self.request.user)
