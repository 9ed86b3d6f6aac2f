from django.urls import path

from classes import views

app_name = "classes"

urlpatterns = [
    path("<int:group_id>/", views.course, name="course"),
    path("<int:group_id>/classes/<int:pk>/", views.edit, name="edit"),
    path("<int:group_id>/classes/<int:pk>/delete/", views.delete, name="delete"),
    path("<int:group_id>/classes/<int:pk>/grants/", views.grant, name="grant"),
]
