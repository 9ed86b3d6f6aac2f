from django.urls import path
from rest_framework.routers import SimpleRouter

from notifications.api.views import NotificationViewSet, PreferenceView, WebhookDeliveryViewSet, WebhookViewSet

router = SimpleRouter(trailing_slash=True)
router.register("webhooks", WebhookViewSet, basename="webhook")
router.register("webhook-deliveries", WebhookDeliveryViewSet, basename="webhookdelivery")
router.register("notifications", NotificationViewSet, basename="notification")

urlpatterns = [
    path("notifications/preferences/", PreferenceView.as_view(), name="notification-preferences-api"),
    *router.urls,
]
