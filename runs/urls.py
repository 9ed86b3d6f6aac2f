from django.urls import path

from runs import views

app_name = "runs"

urlpatterns = [
    path("", views.run_list, name="list"),
    path("<int:pk>/", views.run_detail, name="detail"),
    path("<int:pk>/cancel/", views.run_cancel, name="cancel"),
    path("<int:pk>/discard/", views.run_discard, name="discard"),
]
