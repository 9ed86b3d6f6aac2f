from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from accounts import views as account_views
from monitoring import health
from monitoring import views as monitoring_views
from vclmgr import views

admin.autodiscover()  # here, not at start-up (settings: SimpleAdminConfig)

api_v1 = [
    path("", include("core.api.urls")),
    path("", include("accounts.api.urls")),
    path("", include("inventory.api.urls")),
    path("", include("jobs.api.urls")),
    path("", include("capacity.api.urls")),
    path("", include("provisioning.api.urls")),
    path("", include("environments.api.urls")),
    path("", include("reservations.api.urls")),
    path("", include("runs.api.urls")),
    path("", include("classes.api.urls")),
    path("", include("notifications.api.urls")),
    path("", include("lti.api.urls")),
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
    path("home/panel/", views.home_panel, name="home-panel"),
    path("dashboard/data/", monitoring_views.dashboard_data, name="dashboard-data"),
    path("healthz", health.healthz, name="healthz"),
    path("healthz/live", health.live, name="healthz-live"),
    path("healthz/ready", health.ready, name="healthz-ready"),
    path("metrics", monitoring_views.metrics_view, name="metrics"),
    path("notifications/", include("notifications.urls")),
    path("account/", account_views.account, name="account"),
    path("tokens/", account_views.api_tokens, name="api-tokens"),
    path("tokens/<int:token_id>/revoke/", account_views.revoke_api_token, name="api-token-revoke"),
    path("login/", account_views.LoginView.as_view(), name="login"),
    path("logout/", account_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("inventory/", include("inventory.urls")),
    path("provisioning/", include("jobs.urls")),
    path("reservations/", include("reservations.urls")),
    path("runs/", include("runs.urls")),
    path("environments/", include("environments.urls")),
    path("classes/", include("classes.urls")),
    path("lti/", include("lti.urls")),
    path("vms/", include("provisioning.urls")),
    path("vms/", include("console.urls")),
    # Ganeti's Remote API (plain Django views: outside the /api/v1 schema).
    path("", include("rapi.urls")),
]

if settings.OIDC_ENABLED:
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))
if settings.SAML_ENABLED:
    urlpatterns.append(path("saml2/", include("accounts.saml")))
