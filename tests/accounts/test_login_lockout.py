"""Guessing passwords or tokens is rate-limited: a username is locked out
from one address after LOGIN_FAILURE_LIMIT wrong passwords, on the site's and the admin's
sign-in pages; the API counts unauthenticated calls before it answers 401."""

import logging

import pytest
from django.conf import settings
from django.test import Client

from core.api.throttling import AnonThrottle

pytestmark = pytest.mark.django_db


def _guess(client, url, username, wrong_times):
    for n in range(wrong_times):
        response = client.post(url, {"username": username, "password": f"wrong-{n}"})
        assert response.status_code in {200, 429}


@pytest.mark.parametrize("url", ["/login/", "/admin/login/"])
def test_it_locks_a_username_out_after_repeated_wrong_passwords(url, admin_user):
    client = Client()
    _guess(client, url, "admin", settings.AXES_FAILURE_LIMIT)

    response = client.post(url, {"username": "admin", "password": "admin-pass-1"})

    assert response.status_code == 429
    assert "_auth_user_id" not in client.session


def test_the_lockout_is_per_username_and_address(admin_user, alice):
    _guess(Client(), "/login/", "admin", settings.AXES_FAILURE_LIMIT)

    other_address = Client(REMOTE_ADDR="10.0.0.9")
    assert other_address.post("/login/", {"username": "admin", "password": "admin-pass-1"}).status_code == 302
    same_address_other_user = Client()
    assert same_address_other_user.post("/login/", {"username": "alice", "password": "alice-pass-1"}).status_code == 302


def test_a_spoofed_forwarded_for_does_not_escape_the_lockout(admin_user):
    for n in range(settings.AXES_FAILURE_LIMIT):
        Client(HTTP_X_FORWARDED_FOR=f"10.1.0.{n}").post("/login/", {"username": "admin", "password": "x"})

    spoofed = Client(HTTP_X_FORWARDED_FOR="10.1.1.1")
    response = spoofed.post("/login/", {"username": "admin", "password": "admin-pass-1"})

    assert response.status_code == 429


def test_fewer_failures_than_the_limit_still_let_the_right_password_in(admin_user):
    client = Client()
    _guess(client, "/login/", "admin", settings.AXES_FAILURE_LIMIT - 1)
    assert client.post("/login/", {"username": "admin", "password": "admin-pass-1"}).status_code == 302


@pytest.fixture
def anon_rate(monkeypatch):
    monkeypatch.setattr(AnonThrottle, "THROTTLE_RATES", {"anon": "3/min"})


def test_anonymous_api_calls_are_throttled_before_the_401(api, anon_rate):
    client = api()
    statuses = [client.get("/api/v1/reservations/").status_code for _ in range(5)]
    assert statuses == [401] * 3 + [429] * 2


def test_wrong_tokens_are_throttled(api, anon_rate):
    client = api()
    client.credentials(HTTP_AUTHORIZATION="Bearer vcl_guess")
    statuses = [client.get("/api/v1/reservations/").status_code for _ in range(5)]
    assert statuses == [401] * 3 + [429] * 2
    assert client.get("/api/v1/reservations/").json()["error"]["code"] == "throttled"


def test_a_valid_token_is_not_held_back_by_its_addresss_failures(api, alice, anon_rate):
    anonymous = api()
    for _ in range(5):
        anonymous.get("/api/v1/reservations/")
    assert api(alice).get("/api/v1/reservations/").status_code == 200


def test_behind_a_trusted_proxy_the_forwarded_address_counts(admin_user, settings):
    settings.TRUSTED_PROXIES = 1
    for n in range(settings.AXES_FAILURE_LIMIT):
        Client(HTTP_X_FORWARDED_FOR="10.2.0.1").post("/login/", {"username": "admin", "password": f"x{n}"})

    another_client = Client(HTTP_X_FORWARDED_FOR="10.2.0.2")
    assert another_client.post("/login/", {"username": "admin", "password": "admin-pass-1"}).status_code == 302
    same_client = Client(HTTP_X_FORWARDED_FOR="10.2.0.1")
    assert same_client.post("/login/", {"username": "admin", "password": "admin-pass-1"}).status_code == 429


def test_a_lockout_on_the_web_login_is_logged(admin_user, caplog):
    caplog.set_level(logging.WARNING)
    client = Client()
    _guess(client, "/login/", "admin", settings.AXES_FAILURE_LIMIT - 1)
    assert not any(r.name == "accounts.lockout" for r in caplog.records)  # not yet locked out
    _guess(client, "/login/", "admin", 1)
    assert client.post("/login/", {"username": "admin", "password": "admin-pass-1"}).status_code == 429

    lockouts = [r for r in caplog.records if r.name == "accounts.lockout"]
    # The lockout and the refused right password: whom, from where, on which page.
    assert len(lockouts) == 2 and all(r.levelno == logging.WARNING for r in lockouts), caplog.text
    assert "username 'admin' from 127.0.0.1 on /login/" in lockouts[0].getMessage()
    assert "admin-pass-1" not in caplog.text and "wrong-0" not in caplog.text
