import pytest

from accounts import tokens
from accounts.models import ApiToken

pytestmark = pytest.mark.django_db


def test_a_user_creates_a_token_and_sees_it_once(client, alice):
    client.force_login(alice)
    response = client.post("/tokens/", {"name": "laptop", "scopes": ["reserve", "run"]})
    assert response.status_code == 200
    row = ApiToken.objects.get(user=alice, name="laptop")
    assert row.scopes == ["read", "reserve", "run"]
    html = response.content.decode()
    clear = html.split('<code id="new-token">')[1].split("</code>")[0]
    assert tokens.resolve(clear) == row
    assert clear not in client.get("/tokens/").content.decode()


def test_it_rejects_a_duplicate_name_and_a_past_expiry(client, alice):
    client.force_login(alice)
    tokens.issue(alice, "dup")
    response = client.post("/tokens/", {"name": "dup", "expires": "2001-01-01T00:00"})
    html = response.content.decode()
    assert "You already have a token with this name." in html and "Must be in the future." in html
    assert ApiToken.objects.filter(user=alice).count() == 1


def test_a_user_cannot_revoke_someone_elses_token(client, alice, bob):
    bobs, _ = tokens.issue(bob, "bobs")
    client.force_login(alice)
    client.post(f"/tokens/{bobs.pk}/revoke/")
    assert ApiToken.objects.filter(pk=bobs.pk).exists()
    own, _ = tokens.issue(alice, "mine")
    client.post(f"/tokens/{own.pk}/revoke/")
    assert not ApiToken.objects.filter(pk=own.pk).exists()


def test_the_page_needs_a_login(client):
    assert client.get("/tokens/").status_code == 302
