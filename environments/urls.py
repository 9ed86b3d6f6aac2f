from django.urls import path

from environments import views

app_name = "environments"

urlpatterns = [
    path("", views.template_list, name="list"),
    path("<int:pk>/", views.template_detail, name="detail"),
    path("<int:pk>/delete/", views.template_delete, name="delete"),
]
