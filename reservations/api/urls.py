from django.urls import path
from rest_framework.routers import SimpleRouter

from reservations.api.views import BlockAllocationViewSet, FitCheckView, ReservationViewSet, UsageCSVView, UsageView

router = SimpleRouter(trailing_slash=True)
router.register("reservations", ReservationViewSet, basename="reservation")
router.register("block-allocations", BlockAllocationViewSet, basename="blockallocation")

urlpatterns = [
    path("reservations/check/", FitCheckView.as_view(), name="reservation-check"),
    path("usage/", UsageView.as_view(), name="usage"),
    path("usage/csv/", UsageCSVView.as_view(), name="usage-csv"),
    *router.urls,
]
