from django.urls import path
from rest_framework.routers import SimpleRouter

from jobs.api.views import JobViewSet, OpcodeListView, QueueView

router = SimpleRouter(trailing_slash=True)
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    path("queue/", QueueView.as_view(), name="job-queue"),
    path("opcodes/", OpcodeListView.as_view(), name="job-opcodes"),
    *router.urls,
]
