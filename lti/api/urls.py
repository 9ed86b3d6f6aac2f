from django.urls import path
from rest_framework.routers import SimpleRouter

from lti.api.views import KeyListView, KeyRotateView, PlatformViewSet

router = SimpleRouter(trailing_slash=True)
router.register("lti/platforms", PlatformViewSet, basename="lti-platform")

urlpatterns = [
    path("lti/keys/", KeyListView.as_view(), name="lti-keys-api"),
    path("lti/keys/rotate/", KeyRotateView.as_view(), name="lti-keys-rotate-api"),
    *router.urls,
]
