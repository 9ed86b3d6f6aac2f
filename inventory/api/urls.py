from rest_framework.routers import SimpleRouter

from inventory.api import views

router = SimpleRouter(trailing_slash=True)
router.register("credentials", views.CredentialViewSet, basename="credential")
router.register("node-groups", views.NodeGroupViewSet, basename="nodegroup")
router.register("blade-centers", views.BladeCenterViewSet, basename="bladecenter")
router.register("hypervisors", views.HypervisorViewSet, basename="hypervisor")

urlpatterns = [*router.urls]
