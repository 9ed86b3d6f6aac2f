from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from vclmgr import health, views

api_v1 = [
    path("", include("vclmgr.api.urls")),
    path("", include("inventory.api.urls")),
    path("", include("provisioning.jobs.api.urls")),
    path("", include("provisioning.capacity.api.urls")),
    path("", include("provisioning.vms.api.urls")),
    path("", include("reservations.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves its start-up script as a file (no inline script for the CSP).
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="api/swagger_ui.html"),
        name="api-docs",
    ),
]

urlpatterns = [
    path("", views.home, name="home"),
    path("dashboard/data/", views.dashboard_data, name="dashboard-data"),
    path("healthz", health.healthz, name="healthz"),
    path("tokens/", views.api_tokens, name="api-tokens"),
    path("tokens/<int:token_id>/revoke/", views.revoke_api_token, name="api-token-revoke"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("inventory/", include("inventory.urls")),
    path("provisioning/", include("provisioning.jobs.urls")),
    path("reservations/", include("reservations.urls")),
    path("vms/", include("provisioning.vms.urls")),
]
