from django.urls import path

from console import views

app_name = "console"
urlpatterns = [
    path("<int:pk>/console/", views.console_page, name="page"),
    path("<int:pk>/console/ticket/", views.ticket, name="ticket"),
]
