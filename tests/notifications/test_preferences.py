"""Each user's own notification preferences: the page and the API."""

from notifications import services as notify
from notifications.models import KIND_NAMES


def test_a_user_turns_kinds_off_and_on_through_the_api(alice, api):
    client = api(alice)
    assert client.get("/api/v1/notifications/preferences/").json() == {"disabled": [], "kinds": KIND_NAMES}
    saved = client.put("/api/v1/notifications/preferences/", {"disabled": ["ending", "ready"]}, format="json")
    assert saved.status_code == 200 and saved.json()["disabled"] == ["ending", "ready"]
    assert notify.disabled_kinds(alice) == ["ending", "ready"]
    assert client.put("/api/v1/notifications/preferences/", {"disabled": []}, format="json").json()["disabled"] == []


def test_it_rejects_an_unknown_kind_and_changes_nothing(alice, api):
    notify.set_preferences(alice, ["ended"], actor=alice)
    bad = api(alice).put("/api/v1/notifications/preferences/", {"disabled": ["ended", "spam"]}, format="json")
    assert bad.status_code == 400 and "spam" in bad.content.decode()
    assert notify.disabled_kinds(alice) == ["ended"]


def test_a_read_only_token_cannot_change_them_and_strangers_see_only_their_own(alice, bob, api):
    notify.set_preferences(alice, ["ended"], actor=alice)
    assert (
        api(alice, write=False).put("/api/v1/notifications/preferences/", {"disabled": []}, format="json").status_code
        == 403
    )
    assert api(bob).get("/api/v1/notifications/preferences/").json()["disabled"] == []
    assert api().get("/api/v1/notifications/preferences/").status_code in (401, 403)


def test_the_page_saves_the_ticked_kinds(alice, client):
    client.force_login(alice)
    page = client.get("/notifications/preferences/")
    assert page.status_code == 200 and "Reservation ready" in page.content.decode()
    others = [k for k in KIND_NAMES if k != "ready"]
    assert client.post("/notifications/preferences/", {"kinds": others}).status_code == 302
    assert notify.disabled_kinds(alice) == ["ready"]


def test_the_page_needs_a_sign_in(client):
    assert client.get("/notifications/preferences/").status_code == 302
