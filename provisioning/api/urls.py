from django.urls import path
from rest_framework.routers import SimpleRouter

from provisioning.api.plans import PlanViewSet
from provisioning.api.uploads import ImageUploadsView, ImageUploadView
from provisioning.api.verify import ReleaseClaimView, RepairView, VerifyView
from provisioning.api.views import (
    ImageRevisionViewSet,
    ImageVariantViewSet,
    ImageViewSet,
    QuotaRuleViewSet,
    SimFaultView,
    VMViewSet,
)

router = SimpleRouter(trailing_slash=True)
router.register("images", ImageViewSet, basename="image")
router.register("image-variants", ImageVariantViewSet, basename="imagevariant")
router.register("image-revisions", ImageRevisionViewSet, basename="imagerevision")
router.register("vms", VMViewSet, basename="vm")
router.register("quota-rules", QuotaRuleViewSet, basename="quotarule")
router.register("plans", PlanViewSet, basename="plan")

urlpatterns = [
    path("image-uploads/", ImageUploadsView.as_view(), name="image-uploads"),
    path("image-uploads/<uuid:pk>/", ImageUploadView.as_view(), name="image-upload"),
    path("verify/", VerifyView.as_view(), name="verify"),
    path("verify/claims/<int:pk>/release/", ReleaseClaimView.as_view(), name="verify-release-claim"),
    path("verify/repairs/", RepairView.as_view(), name="verify-repair"),
    path("hypervisors/<int:pk>/sim-faults/", SimFaultView.as_view(), name="hypervisor-sim-faults"),
    *router.urls,
]
