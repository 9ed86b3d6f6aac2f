"""The LTI API and CLI: administrators register platforms and rotate keys; nobody else may, and
no answer carries a private key."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from lti_tool.models import Key, LtiRegistration

from core.models import ObjectChange

pytestmark = pytest.mark.django_db

BODY = {
    "name": "Campus Canvas",
    "issuer": "https://canvas.instructure.com",
    "client_id": "10000000000042",
    "deployment_ids": ["12:abcdef"],
    "keyset_url": "https://canvas.example.edu/api/lti/security/jwks",
    "auth_url": "https://canvas.example.edu/api/lti/authorize_redirect",
    "token_url": "https://canvas.example.edu/login/oauth2/token",
}


def test_an_administrator_registers_changes_and_removes_a_platform(api, admin_user):
    client = api(admin_user)
    made = client.post("/api/v1/lti/platforms/", BODY, format="json")
    assert made.status_code == 201, made.content
    pk = made.json()["id"]
    assert made.json()["deployment_ids"] == ["12:abcdef"] and Key.objects.active().count() == 1
    changed = client.patch(f"/api/v1/lti/platforms/{pk}/", {"deployment_ids": ["12:abcdef", "13:x"]}, format="json")
    assert changed.status_code == 200 and changed.json()["deployment_ids"] == ["12:abcdef", "13:x"]
    assert ObjectChange.objects.filter(object_id=str(pk)).count() == 2
    assert client.delete(f"/api/v1/lti/platforms/{pk}/").status_code == 204
    assert not LtiRegistration.objects.exists()


def test_no_answer_carries_a_private_key(api, admin_user):
    client = api(admin_user)
    client.post("/api/v1/lti/platforms/", BODY, format="json")
    rotated = client.post("/api/v1/lti/keys/rotate/", {}, format="json")
    assert rotated.status_code == 200 and rotated.json()["retired"] == []
    answers = [client.get(path).content for path in ("/api/v1/lti/platforms/", "/api/v1/lti/keys/", "/lti/jwks/")]
    assert len(json.loads(answers[1])) == 2
    for text in answers:
        assert b"PRIVATE KEY" not in text and b'"d"' not in text and b"private" not in text
    assert not any("PRIVATE" in key.private_key for key in Key.objects.all())  # stored encrypted


@pytest.mark.parametrize("field, value", [("deployment_ids", []), ("keyset_url", "not a url"), ("colour", "red")])
def test_a_bad_platform_is_a_400_and_nothing(api, admin_user, field, value):
    answer = api(admin_user).post("/api/v1/lti/platforms/", {**BODY, field: value}, format="json")
    assert answer.status_code == 400 and field in answer.json()["error"]["fields"]
    assert not LtiRegistration.objects.exists()


def test_the_same_issuer_and_client_twice_is_refused(api, admin_user):
    client = api(admin_user)
    assert client.post("/api/v1/lti/platforms/", BODY, format="json").status_code == 201
    assert client.post("/api/v1/lti/platforms/", BODY, format="json").status_code in (400, 409)
    assert LtiRegistration.objects.count() == 1


def test_a_user_who_is_no_administrator_gets_a_403(api, alice, admin_user):
    api(admin_user).post("/api/v1/lti/platforms/", BODY, format="json")
    client = api(alice)
    assert client.get("/api/v1/lti/platforms/").status_code == 403
    assert client.post("/api/v1/lti/platforms/", {**BODY, "client_id": "2"}, format="json").status_code == 403
    assert client.get("/api/v1/lti/keys/").status_code == 403
    assert client.post("/api/v1/lti/keys/rotate/", {}, format="json").status_code == 403
    assert api().get("/api/v1/lti/platforms/").status_code in (401, 403)
    assert LtiRegistration.objects.count() == 1 and Key.objects.count() == 1


def test_a_read_only_token_cannot_register(api, admin_user):
    assert api(admin_user, write=False).post("/api/v1/lti/platforms/", BODY, format="json").status_code == 403


def test_the_schema_has_the_lti_endpoints(api, admin_user):
    paths = api(admin_user).get("/api/v1/schema/", {"format": "json"}).json()["paths"]
    assert {"/api/v1/lti/platforms/", "/api/v1/lti/platforms/{id}/", "/api/v1/lti/keys/rotate/"} <= set(paths)


def test_the_cli_adds_lists_rotates_and_removes(capsys):
    call_command(
        "lti", "add", "Moodle", "--issuer", "https://moodle.example.edu", "--client-id", "abc",
        "--deployment", "1", "--keyset-url", "https://moodle.example.edu/mod/lti/certs.php",
        "--auth-url", "https://moodle.example.edu/mod/lti/auth.php",
        "--token-url", "https://moodle.example.edu/mod/lti/token.php",
    )  # fmt: skip
    call_command("lti", "list")
    call_command("lti", "rotate-keys")
    call_command("lti", "keys")
    out = capsys.readouterr().out
    assert "Moodle\thttps://moodle.example.edu\tclient abc\tdeployments 1" in out and out.count("\tactive\t") == 2
    assert "PRIVATE" not in out
    with pytest.raises(CommandError, match="deployment_ids"):
        call_command(
            "lti", "add", "Again", "--issuer", "https://x.example", "--client-id", "x", "--deployment", " ",
            "--keyset-url", "https://x.example/k", "--auth-url", "https://x.example/a", "--token-url", "https://x.example/t",
        )  # fmt: skip
    call_command("lti", "remove", "--issuer", "https://moodle.example.edu", "--client-id", "abc")
    assert not LtiRegistration.objects.exists()
