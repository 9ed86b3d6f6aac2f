from django.urls import path

from lti import views

app_name = "lti"

urlpatterns = [
    path("login/", views.oidc_login, name="login"),
    path("launch/", views.launch, name="launch"),
    path("jwks/", views.jwks, name="jwks"),
    path("courses/<int:group_id>/roster/sync/", views.sync_roster, name="sync-roster"),
]
