from django.urls import path
from rest_framework.routers import SimpleRouter

from reservations.api.templates import RevisionTestView, TemplateDiscardView, TemplatePublishView, TemplateView
from reservations.api.views import (
    ApprovalRequestViewSet,
    BlockAllocationViewSet,
    FitCheckView,
    ReservationViewSet,
    ShowbackCSVView,
    ShowbackView,
    UsageCSVView,
    UsageView,
)

router = SimpleRouter(trailing_slash=True)
router.register("reservations", ReservationViewSet, basename="reservation")
router.register("block-allocations", BlockAllocationViewSet, basename="blockallocation")
router.register("approvals", ApprovalRequestViewSet, basename="approvalrequest")

urlpatterns = [
    path("reservations/check/", FitCheckView.as_view(), name="reservation-check"),
    path("usage/", UsageView.as_view(), name="usage"),
    path("images/<int:pk>/template/", TemplateView.as_view(), name="image-template"),
    path("images/<int:pk>/template/publish/", TemplatePublishView.as_view(), name="image-template-publish"),
    path("images/<int:pk>/template/discard/", TemplateDiscardView.as_view(), name="image-template-discard"),
    path("image-revisions/<int:pk>/test/", RevisionTestView.as_view(), name="imagerevision-test"),
    path("usage/csv/", UsageCSVView.as_view(), name="usage-csv"),
    path("usage/showback/", ShowbackView.as_view(), name="usage-showback"),
    path("usage/showback/csv/", ShowbackCSVView.as_view(), name="usage-showback-csv"),
    *router.urls,
]
