from django.urls import path

from core.api.views import EventListView

urlpatterns = [
    path("events/", EventListView.as_view(), name="api-events"),
]
