from django.urls import path
from rest_framework.routers import SimpleRouter

from vclmgr.api.views import ApiTokenViewSet, EventListView, MeView

router = SimpleRouter(trailing_slash=True)
router.register("tokens", ApiTokenViewSet, basename="apitoken")

urlpatterns = [
    path("me/", MeView.as_view(), name="api-me"),
    path("events/", EventListView.as_view(), name="api-events"),
    *router.urls,
]
