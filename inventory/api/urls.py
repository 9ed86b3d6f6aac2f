from django.urls import path
from rest_framework.routers import SimpleRouter

from inventory.api import views
from inventory.discovery.api import DiscoverView

router = SimpleRouter(trailing_slash=True)
router.register("credentials", views.CredentialViewSet, basename="credential")
router.register("node-groups", views.NodeGroupViewSet, basename="nodegroup")
router.register("blade-centers", views.BladeCenterViewSet, basename="bladecenter")
router.register("hypervisors", views.HypervisorViewSet, basename="hypervisor")

urlpatterns = [
    path("hypervisors/discover/", DiscoverView.as_view(), name="hypervisor-discover"),  # before hypervisors/<pk>/
    *router.urls,
]
