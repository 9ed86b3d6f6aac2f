from django.urls import path

from inventory import views

app_name = "inventory"

urlpatterns = [
    path("", views.hypervisor_list, name="hypervisors"),
    path("hypervisors/<int:pk>/", views.hypervisor_detail, name="hypervisor"),
    path("hypervisors/<int:pk>/state/", views.hypervisor_state, name="hypervisor-state"),
    path("hypervisors/<int:pk>/schedule/", views.hypervisor_schedule, name="hypervisor-schedule"),
    path("hypervisors/<int:pk>/schedule/cancel/", views.hypervisor_schedule_cancel, name="hypervisor-schedule-cancel"),
    path("blade-centers/", views.blade_center_list, name="bladecenters"),
    path("blade-centers/<int:pk>/", views.blade_center_detail, name="bladecenter"),
]
