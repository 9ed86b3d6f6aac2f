from django.urls import path

from classes import views

app_name = "classes"

urlpatterns = [
    path("<int:group_id>/", views.course, name="course"),
]
