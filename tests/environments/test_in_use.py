"""A template that something names (a reservation, a block, a class, a run) is not deleted: every
surface refuses it with the same words, and says to switch it off instead."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from core.errors import InUse
from environments import services
from environments.models import EnvironmentTemplate
from reservations import services as reservations

pytestmark = pytest.mark.django_db

WORDS = "environment template netlab is in use by 1 reservations: switch it off (inactive) instead"


@pytest.fixture
def reserved(make_host, netlab, alice):
    make_host("big", cpus=16, memory_mib=16384)
    reservations.reserve_environment(alice, netlab, actor=alice, duration=timedelta(hours=1))
    return netlab


def test_the_service_refuses_a_template_once_reserved(reserved, alice):
    with pytest.raises(InUse) as refused:
        services.delete_template(reserved, actor=alice)
    assert str(refused.value) == WORDS
    services.update_template(reserved, actor=alice, active=False)  # what it says to do instead
    assert EnvironmentTemplate.objects.filter(pk=reserved.pk, active=False).exists()


def test_the_api_answers_409_with_the_words(api, reserved, alice):
    response = api(alice).delete(f"/api/v1/environments/{reserved.pk}/")
    assert response.status_code == 409 and response.json()["error"]["message"] == WORDS


def test_the_page_shows_the_words(client, reserved, alice):
    client.force_login(alice)
    response = client.post(f"/environments/{reserved.pk}/delete/", follow=True)
    assert response.status_code == 200 and WORDS in response.content.decode()
    assert EnvironmentTemplate.objects.filter(pk=reserved.pk).exists()


def test_the_cli_fails_with_the_words(reserved):
    with pytest.raises(CommandError, match="in use by 1 reservations"):
        call_command("environment", "delete", "netlab", "--user", "alice", stdout=StringIO())


def test_the_admin_lists_what_holds_it(client, reserved, admin_user):
    client.force_login(admin_user)
    url = f"/admin/environments/environmenttemplate/{reserved.pk}/delete/"
    response = client.post(url, {"post": "yes"}, follow=True)
    assert response.status_code == 200 and "Cannot delete environment template" in response.content.decode()
    assert EnvironmentTemplate.objects.filter(pk=reserved.pk).exists()
