"""A user's time zone: chosen on the account page or through the API (their own only), else the
one their browser reports, else the site's; pages use it, the API stays UTC."""

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.cache import cache
from django.utils import timezone

from accounts import preferences
from accounts.middleware import TimeZoneMiddleware
from accounts.models import Preferences
from core.models import ObjectChange

pytestmark = pytest.mark.django_db

ME = "/api/v1/me/"


@pytest.fixture(autouse=True)
def _no_cached_zones():
    cache.clear()
    yield
    cache.clear()


def test_a_user_without_a_choice_gets_the_sites_zone_and_no_row(alice, settings):
    settings.TIME_ZONE = "America/New_York"
    assert preferences.zone_name(alice) == "America/New_York"
    assert not Preferences.objects.filter(user=alice).exists()


def test_the_account_page_changes_the_zone_pages_use(client, alice):
    client.force_login(alice)
    page = client.get("/account/").content.decode()
    assert '<strong id="zone-in-use">UTC</strong>' in page
    response = client.post("/account/", {"time_zone": "Europe/Berlin"})
    assert response.status_code == 302
    assert Preferences.objects.get(user=alice).time_zone == "Europe/Berlin"
    assert ObjectChange.objects.filter(action="update", changes={"time_zone": ["", "Europe/Berlin"]}).exists()
    page = client.get("/account/").content.decode()
    assert '<strong id="zone-in-use">Europe/Berlin</strong>' in page
    assert ("CET" in page) or ("CEST" in page)


def test_it_rejects_a_zone_that_is_not_one(client, alice):
    client.force_login(alice)
    response = client.post("/account/", {"time_zone": "Mars/Olympus"})
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not Preferences.objects.filter(user=alice).exists()


def test_the_browsers_zone_applies_until_one_is_chosen_and_is_kept_for_emails(client, alice):
    client.force_login(alice)
    client.cookies[preferences.COOKIE] = "Asia/Tokyo"
    assert '<strong id="zone-in-use">Asia/Tokyo</strong>' in client.get("/account/").content.decode()
    assert Preferences.objects.get(user=alice).browser_time_zone == "Asia/Tokyo"
    assert preferences.zone_name(alice) == "Asia/Tokyo"  # outside a request: an e-mail's
    preferences.set_time_zone(alice, "Europe/Lisbon", actor=alice)
    assert '<strong id="zone-in-use">Europe/Lisbon</strong>' in client.get("/account/").content.decode()
    client.cookies[preferences.COOKIE] = "not a zone"
    assert '<strong id="zone-in-use">Europe/Lisbon</strong>' in client.get("/account/").content.decode()
    assert Preferences.objects.get(user=alice).browser_time_zone == "Asia/Tokyo"


def test_a_signed_out_page_uses_the_browsers_zone_and_the_api_utc(rf, settings):
    settings.TIME_ZONE = "Europe/Paris"
    seen = []
    middleware = TimeZoneMiddleware(lambda request: seen.append(timezone.get_current_timezone_name()))
    for path in ("/login/", "/api/v1/me/", "/2/instances"):
        request = rf.get(path, HTTP_COOKIE=f"{preferences.COOKIE}=America/Chicago")
        request.user = AnonymousUser()
        middleware(request)
    assert seen == ["America/Chicago", "UTC", "UTC"]


def test_the_api_reads_and_changes_ones_own_zone(api, alice, bob):
    preferences.set_time_zone(bob, "Asia/Tokyo", actor=bob)
    client = api(alice)
    assert client.get(ME).json()["time_zone"] == ""
    response = client.patch(ME, {"time_zone": "Europe/Berlin"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["time_zone"] == "Europe/Berlin" == response.json()["time_zone_in_use"]
    assert preferences.zone_name(bob) == "Asia/Tokyo"  # only one's own: there is no user to name
    bad = client.patch(ME, {"time_zone": "Europe/Nowhere"}, format="json")
    assert bad.status_code == 400 and "time_zone" in bad.json()["error"]["fields"]
    assert client.patch(ME, {"username": "mallory"}, format="json").status_code == 400
    assert preferences.zone_name(alice) == "Europe/Berlin"
    cleared = client.patch(ME, {"time_zone": ""}, format="json")
    assert cleared.json()["time_zone"] == "" and cleared.json()["time_zone_in_use"] == "UTC"


def test_a_read_only_token_cannot_change_the_zone(api, alice):
    assert api(alice, write=False).patch(ME, {"time_zone": "Europe/Berlin"}, format="json").status_code == 403
    assert preferences.zone_name(alice) == "UTC"


def test_the_api_answers_in_utc_for_a_user_in_another_zone(api, alice):
    preferences.set_time_zone(alice, "America/Los_Angeles", actor=alice)
    client = api(alice)
    created = client.get("/api/v1/tokens/").json()["results"][0]["created"]
    assert created.endswith("Z") or created.endswith("+00:00"), created
    assert timezone.get_current_timezone_name() == "UTC"


def test_pages_go_on_from_the_database_when_the_cache_is_down(client, alice, monkeypatch):
    preferences.set_time_zone(alice, "Europe/Berlin", actor=alice)

    def down(*args, **kwargs):
        raise ConnectionError("cache down")

    for verb in ("get", "set", "delete"):
        monkeypatch.setattr(preferences.cache, verb, down)
    client.force_login(alice)
    assert '<strong id="zone-in-use">Europe/Berlin</strong>' in client.get("/account/").content.decode()
    assert client.post("/account/", {"time_zone": "Europe/Rome"}).status_code == 302
    assert preferences.zone_name(alice) == "Europe/Rome"


def test_sign_in_reads_the_zone_once_and_keeps_the_browsers(client, alice, django_assert_num_queries):
    client.cookies[preferences.COOKIE] = "Europe/Madrid"
    assert client.post("/login/", {"username": "alice", "password": "alice-pass-1"}).status_code == 302
    assert Preferences.objects.get(user=alice).browser_time_zone == "Europe/Madrid"
    with django_assert_num_queries(0):
        assert preferences.stored(alice) == ("", "Europe/Madrid")
