import pytest
from django.contrib.auth.models import AnonymousUser

from core import topics

pytestmark = pytest.mark.django_db


def test_users_may_follow_only_their_own_topic(alice, bob, admin_user):
    assert topics.may_subscribe(alice, f"user.{alice.pk}")
    assert not topics.may_subscribe(alice, f"user.{bob.pk}")
    assert not topics.may_subscribe(alice, "admin")
    assert topics.may_subscribe(admin_user, "admin")
    assert topics.may_subscribe(admin_user, f"user.{bob.pk}")


@pytest.mark.parametrize("topic", ["", "nosuchprefix.1", "user.1 ; drop", "../x", "a" * 200])
def test_it_refuses_unknown_or_malformed_topics(admin_user, topic):
    assert not topics.may_subscribe(admin_user, topic)


def test_anonymous_users_follow_nothing():
    assert not topics.may_subscribe(AnonymousUser(), "user.1")


def test_the_events_api_checks_each_topic(api, alice, bob):
    from core import events

    events.emit("note", {"n": 1}, [f"user.{alice.pk}", f"user.{bob.pk}"])
    client = api(alice)
    mine = client.get(f"/api/v1/events/?topic=user.{alice.pk}&since=0").json()
    assert [e["data"] for e in mine] == [{"n": 1}]
    assert client.get(f"/api/v1/events/?topic=user.{bob.pk}").status_code == 403
    assert client.get("/api/v1/events/?topic=admin").status_code == 403
    assert client.get(f"/api/v1/events/?topic=user.{alice.pk}&since=x").status_code == 400


def test_a_topic_that_needs_a_role_is_refused_until_the_accounts_app_gives_the_check(admin_user):
    # The core knows no roles: AccountsConfig.ready hands it accounts.access.can.
    assert topics.may_subscribe(admin_user, "admin")
    with topics.ROLE_CHECK.replaced():
        assert not topics.may_subscribe(admin_user, "admin")
