from django.urls import path
from rest_framework.routers import SimpleRouter

from accounts.api.views import ApiTokenViewSet, MeView, UserRolesView

router = SimpleRouter(trailing_slash=True)
router.register("tokens", ApiTokenViewSet, basename="apitoken")

urlpatterns = [
    path("me/", MeView.as_view(), name="api-me"),
    path("users/<int:pk>/roles/", UserRolesView.as_view(), name="api-user-roles"),
    *router.urls,
]
