from django.urls import path

from capacity.api.views import PlanView

urlpatterns = [
    path("placement/plan/", PlanView.as_view(), name="placement-plan"),
]
