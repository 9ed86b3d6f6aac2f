"""Credentials: encrypted at rest, never shown back (admin, API, export)."""

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings

from core import changelog
from inventory import crypto, services
from inventory.models import Credential
from tests.inventory.conftest import TEST

SECRET = "hunter2-very-secret"  # noqa: S105


def test_the_secret_is_encrypted_at_rest(db, credential):
    with connection.cursor() as cursor:
        cursor.execute("SELECT encrypted_secret FROM inventory_credential WHERE id = %s", [credential.pk])
        stored = cursor.fetchone()[0]
    assert SECRET not in stored and stored.startswith("gAAAA")
    assert Credential.objects.get(pk=credential.pk).get_secret() == SECRET


def test_update_keeps_replaces_or_removes_the_secret(db, credential):
    services.update_credential(credential, actor=TEST, username="admin")
    assert Credential.objects.get(pk=credential.pk).get_secret() == SECRET
    services.update_credential(credential, actor=TEST, secret="new-one")  # noqa: S106
    assert Credential.objects.get(pk=credential.pk).get_secret() == "new-one"
    services.update_credential(credential, actor=TEST, secret="")
    assert not Credential.objects.get(pk=credential.pk).has_secret
    logged = [c.changes for c in changelog.history(credential)]
    assert {"secret": ["***", "***"]} in logged and SECRET not in str(logged) and "new-one" not in str(logged)


def test_keys_rotate_first_encrypts_any_decrypts(db, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.CREDENTIAL_KEY = old
    token = crypto.encrypt("s3")
    settings.CREDENTIAL_KEY = f"{new},{old}"
    assert crypto.decrypt(token) == "s3"
    assert Fernet(new.encode()).decrypt(crypto.encrypt("s4").encode()) == b"s4"
    settings.CREDENTIAL_KEY = new
    with pytest.raises(crypto.SecretUnreadable):
        crypto.decrypt(token)


@override_settings(CREDENTIAL_KEY="not-a-key")
def test_a_malformed_key_is_refused_clearly():
    with pytest.raises(ImproperlyConfigured, match="32 url-safe base64-encoded bytes"):
        crypto.check_key()


@override_settings(CREDENTIAL_KEY=None)
def test_without_debug_a_missing_key_is_an_error(monkeypatch):
    monkeypatch.setenv("DEBUG", "0")
    with pytest.raises(ImproperlyConfigured, match="CREDENTIAL_KEY is required"):
        crypto.encrypt("x")


@override_settings(CREDENTIAL_KEY=None)
def test_in_debug_a_key_is_generated_once_into_var(monkeypatch, settings, tmp_path):
    monkeypatch.setenv("DEBUG", "1")
    settings.VAR_DIR = tmp_path
    token = crypto.encrypt("x")
    key_file = tmp_path / "credential_key"
    assert key_file.exists() and oct(key_file.stat().st_mode)[-3:] == "600"
    assert crypto.decrypt(token) == "x"
    assert Fernet(key_file.read_text().encode()).decrypt(token.encode()) == b"x"


def test_the_api_never_returns_the_secret(db, api, admin_user, credential):
    client = api(admin_user)
    created = client.post("/api/v1/credentials/", {"name": "c2", "username": "u", "secret": "pa55"}, format="json")
    assert created.status_code == 201 and "secret" not in created.json() and created.json()["has_secret"]
    for url in (
        "/api/v1/credentials/",
        f"/api/v1/credentials/{credential.pk}/",
        f"/api/v1/credentials/{credential.pk}/changes/",
    ):
        body = client.get(url).content.decode()
        assert SECRET not in body and "pa55" not in body and "gAAAA" not in body
    assert Credential.objects.get(name="c2").get_secret() == "pa55"


def test_the_admin_never_shows_the_secret(db, client, admin_user, credential):
    client.force_login(admin_user)
    page = client.get(f"/admin/inventory/credential/{credential.pk}/change/").content.decode()
    assert SECRET not in page and credential.encrypted_secret not in page
    response = client.post(
        f"/admin/inventory/credential/{credential.pk}/change/",
        {"name": "root-ssh", "username": "root", "secret": "", "description": "kept"},
    )
    assert response.status_code == 302
    assert Credential.objects.get(pk=credential.pk).get_secret() == SECRET  # blank keeps it
    client.post("/admin/inventory/credential/add/", {"name": "c3", "username": "u", "secret": "fresh-secret"})
    assert Credential.objects.get(name="c3").get_secret() == "fresh-secret"


def test_exports_name_the_credential_but_hold_no_secret(db, make_host, credential):
    make_host(credential=credential)
    for fmt in ("csv", "json", "yaml"):
        body = services.export_hypervisors(fmt).decode()
        assert "root-ssh" in body and SECRET not in body and "gAAAA" not in body


@override_settings(CREDENTIAL_KEY=None)
def test_the_deploy_check_reports_a_missing_key(monkeypatch):
    from inventory.apps import credential_key_check

    monkeypatch.setenv("DEBUG", "0")
    assert [e.id for e in credential_key_check(None)] == ["inventory.E001"]
    with override_settings(CREDENTIAL_KEY=Fernet.generate_key().decode()):
        assert credential_key_check(None) == []
