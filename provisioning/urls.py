from django.urls import path

from provisioning import capture_views, plan_views, verify_views, views

app_name = "vms"

urlpatterns = [
    path("", views.vm_list, name="vms"),
    path("<int:pk>/", views.vm_detail, name="vm"),
    path("<int:pk>/action/", views.vm_action, name="vm-action"),
    path("<int:pk>/resize/", views.vm_resize, name="vm-resize"),
    path("<int:pk>/capture/", capture_views.vm_capture, name="vm-capture"),
    path("images/", views.image_list, name="images"),
    path("images/new/", views.image_edit, name="image-new"),
    path("images/<int:pk>/", views.image_detail, name="image"),
    path("images/<int:pk>/edit/", views.image_edit, name="image-edit"),
    path("images/<int:pk>/delete/", views.image_delete, name="image-delete"),
    path("images/<int:pk>/variants/", views.variant_add, name="variant-add"),
    path("images/<int:pk>/share/", views.image_share, name="image-share"),
    path("images/<int:pk>/rename/", views.image_rename, name="image-rename"),
    path("verify/", verify_views.report, name="verify"),
    path("verify/run/", verify_views.run_now, name="verify-run"),
    path("verify/claims/<int:pk>/release/", verify_views.release_claim, name="verify-release-claim"),
    path("verify/repair/<slug:action>/", verify_views.repair_finding, name="verify-repair"),
    path("plans/", plan_views.plan_list, name="plans"),
    path("plans/new/", plan_views.plan_create, name="plan-new"),
    path("plans/<int:pk>/", plan_views.plan_detail, name="plan"),
    path("plans/<int:pk>/action/", plan_views.plan_action, name="plan-action"),
    path("variants/<int:pk>/delete/", views.variant_delete, name="variant-delete"),
    path("images/<int:pk>/revisions/", views.revision_add, name="revision-add"),
    path("revisions/<int:pk>/<slug:action>/", views.revision_action, name="revision-action"),
]
