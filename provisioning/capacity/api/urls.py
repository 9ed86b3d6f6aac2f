from django.urls import path

from provisioning.capacity.api.views import PlanView

urlpatterns = [
    path("placement/plan/", PlanView.as_view(), name="placement-plan"),
]
