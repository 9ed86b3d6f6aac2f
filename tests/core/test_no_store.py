"""Answers that carry secrets or per-user data are never stored by a cache."""

import pytest

pytestmark = pytest.mark.django_db


def no_store(response):
    return "no-store" in response.get("Cache-Control", "")


def test_a_new_api_token_is_not_stored(api, alice):
    response = api(alice).post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert response.status_code == 201 and no_store(response)


def test_every_api_answer_is_not_stored_even_an_error(api, alice):
    assert no_store(api(alice).get("/api/v1/reservations/"))
    assert no_store(api().get("/api/v1/reservations/"))  # 401


def test_a_signed_in_users_pages_are_not_stored(client, alice):
    client.force_login(alice)
    response = client.get("/tokens/")
    assert response.status_code == 200 and no_store(response)


def test_anonymous_pages_keep_their_own_caching(client):
    response = client.get("/")  # to the login page
    assert response.status_code == 302 and not no_store(response)
