from django.urls import path
from rest_framework.routers import SimpleRouter

from reservations.api.views import BlockAllocationViewSet, FitCheckView, ReservationViewSet

router = SimpleRouter(trailing_slash=True)
router.register("reservations", ReservationViewSet, basename="reservation")
router.register("block-allocations", BlockAllocationViewSet, basename="blockallocation")

urlpatterns = [
    path("reservations/check/", FitCheckView.as_view(), name="reservation-check"),
    *router.urls,
]
