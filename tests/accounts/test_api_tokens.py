from datetime import timedelta

import pytest
from django.utils import timezone

from accounts import tokens
from accounts.models import ApiToken

pytestmark = pytest.mark.django_db


def test_a_new_token_is_shown_once_and_stored_only_as_a_digest(client, alice):
    client.force_login(alice)
    response = client.post("/api/v1/tokens/", {"name": "ci", "scopes": ["reserve"]}, content_type="application/json")
    assert response.status_code == 201
    clear = response.json()["token"]
    assert clear.startswith("vcl_")
    row = ApiToken.objects.get(user=alice)
    assert clear not in (row.digest, row.prefix) and row.digest == tokens.digest(clear)
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["ci"] and "token" not in listed[0]


def test_a_token_authenticates_api_calls(alice):
    _, clear = tokens.issue(alice, "ci")
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {clear}")
    assert client.get("/api/v1/me/").json()["username"] == "alice"


def test_it_rejects_unknown_and_expired_tokens(alice):
    from rest_framework.test import APIClient

    row, clear = tokens.issue(alice, "old", expires=timezone.now() + timedelta(hours=1))
    ApiToken.objects.filter(pk=row.pk).update(expires=timezone.now() - timedelta(seconds=1))
    for header in [f"Bearer {clear}", "Bearer vcl_nope", "Basic abc"]:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        response = client.get("/api/v1/me/")
        assert response.status_code == 401
        assert response.json()["error"]["status"] == 401


def test_a_read_only_token_cannot_write(api, alice):
    client = api(alice, write=False)
    assert client.get("/api/v1/tokens/").status_code == 200
    response = client.post("/api/v1/tokens/", {"name": "x"})
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "This token does not carry the scope this request needs."


def test_users_see_and_revoke_only_their_own_tokens(api, alice, bob):
    bobs, _ = tokens.issue(bob, "bobs")
    client = api(alice)
    assert client.get(f"/api/v1/tokens/{bobs.pk}/").status_code == 404
    assert client.delete(f"/api/v1/tokens/{bobs.pk}/").status_code == 404
    assert ApiToken.objects.filter(pk=bobs.pk).exists()
    own, _ = tokens.issue(alice, "mine")
    assert client.delete(f"/api/v1/tokens/{own.pk}/").status_code == 204
    assert not ApiToken.objects.filter(pk=own.pk).exists()


def test_validation_errors_use_the_one_error_format(api, alice):
    client = api(alice)
    client.post("/api/v1/tokens/", {"name": "dup"})
    response = client.post("/api/v1/tokens/", {"name": "dup", "expires": "2001-01-01T00:00:00Z"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["fields"]["name"] == ["you already have a token with this name"]
    assert error["fields"]["expires"] == ["must be in the future"]


def test_anonymous_requests_are_refused_in_json(client):
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_unknown_api_urls_answer_json_not_html(client):
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["status"] == 404


def test_lists_are_paginated(api, alice):
    for i in range(3):
        tokens.issue(alice, f"t{i}")
    body = api(alice).get("/api/v1/tokens/?page_size=2").json()
    assert body["count"] == 4 and len(body["results"]) == 2 and body["next"]


def test_the_schema_and_docs_are_served_from_local_assets(client, alice):
    client.force_login(alice)
    schema = client.get("/api/v1/schema/?format=json")
    assert schema.status_code == 200
    assert "/api/v1/tokens/" in schema.json()["paths"]
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    assert "cdn" not in html.lower()


@pytest.mark.parametrize(
    ("access", "anonymous", "user", "staff"),
    [("users", 401, 200, 200), ("staff", 401, 403, 200), ("public", 200, 200, 200)],
)
def test_who_may_read_the_schema_is_a_setting(access, anonymous, user, staff, api, alice, admin_user, settings):
    """The schema maps every endpoint: by default signed-in users (integrations) only."""
    settings.API_SCHEMA_ACCESS = access
    answers = [client.get("/api/v1/schema/?format=json").status_code for client in (api(), api(alice), api(admin_user))]
    assert answers == [anonymous, user, staff]


def test_api_calls_are_throttled(api, alice, monkeypatch):
    from core.api.throttling import UserThrottle

    monkeypatch.setattr(UserThrottle, "THROTTLE_RATES", {"user": "5/min"})
    client = api(alice)
    answers = [client.get("/api/v1/me/") for _ in range(7)]
    assert [a.status_code for a in answers] == [200] * 5 + [429] * 2
    assert answers[-1].json()["error"]["code"] == "throttled"  # the refusal itself, not one more call
