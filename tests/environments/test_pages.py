"""The environment pages: the templates a user may use, one template's machines and networks;
and the admin, whose writes go through the services."""

import pytest

from environments.models import EnvironmentTemplate

pytestmark = pytest.mark.django_db


def test_the_list_shows_a_users_own_templates_and_not_anothers(client, alice, bob, netlab):
    client.force_login(alice)
    page = client.get("/environments/").content.decode()
    assert f'href="/environments/{netlab.pk}/"' in page and "client-b ×2" in page and "its owner only" in page
    client.force_login(bob)
    page = client.get("/environments/").content.decode()
    assert "netlab" not in page and "No environment templates yet." in page


def test_the_detail_page_lists_each_machine_and_network(client, alice, netlab):
    client.force_login(alice)
    page = client.get(f"/environments/{netlab.pk}/").content.decode()
    for hostname in ("router", "client-a", "client-b-1", "client-b-2"):
        assert f'id="machine-{hostname}"' in page
    assert "192.168.10.0/24" in page and "192.168.0.0/24" in page and "entry point" in page
    assert "Delete template" in page


def test_another_users_template_is_a_404_and_staff_see_it_without_a_delete_button_for_strangers(
    client, bob, admin_user, netlab
):
    client.force_login(bob)
    assert client.get(f"/environments/{netlab.pk}/").status_code == 404
    assert client.post(f"/environments/{netlab.pk}/delete/").status_code == 404
    client.force_login(admin_user)
    assert client.get(f"/environments/{netlab.pk}/").status_code == 200


def test_a_user_who_sees_a_public_template_cannot_delete_it(client, bob, admin_user, netlab):
    from environments import services

    services.update_template(netlab, actor=admin_user, visibility="public")
    client.force_login(bob)
    page = client.get(f"/environments/{netlab.pk}/").content.decode()
    assert "Delete template" not in page
    response = client.post(f"/environments/{netlab.pk}/delete/", follow=True)
    assert "only its owner" in response.content.decode() and EnvironmentTemplate.objects.filter(pk=netlab.pk).exists()


def test_the_owner_deletes_it_from_its_page(client, alice, netlab):
    client.force_login(alice)
    response = client.post(f"/environments/{netlab.pk}/delete/", follow=True)
    assert "Environment template netlab deleted." in response.content.decode()
    assert not EnvironmentTemplate.objects.exists()


def test_the_admin_shows_members_and_shares_through_the_service(client, admin_user, netlab):
    from django.contrib.auth.models import Group

    from core.changelog import history

    lab = Group.objects.create(name="lab")
    client.force_login(admin_user)
    url = f"/admin/environments/environmenttemplate/{netlab.pk}/change/"
    page = client.get(url).content.decode()
    assert "client-b" in page and "192.168.10.0/24" in page
    form = {
        "name": "netlab",
        "description": "Two LANs.",
        "visibility": "restricted",
        "groups": [lab.pk],
        "active": "on",
        **{f"{prefix}-{key}": value for prefix in ("networks", "members") for key, value in _empty_inline().items()},
    }
    response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:3000]
    netlab.refresh_from_db()
    assert netlab.description == "Two LANs." and list(netlab.groups.all()) == [lab]
    assert netlab.members.count() == 3
    assert [e.action for e in history(netlab)][:2] == ["update", "update"]
    assert client.get("/admin/environments/environmenttemplate/add/").status_code == 403
    assert "netlab" in client.get("/admin/environments/environmenttemplate/").content.decode()


def _empty_inline():
    return {"TOTAL_FORMS": "0", "INITIAL_FORMS": "0", "MIN_NUM_FORMS": "0", "MAX_NUM_FORMS": "1000"}
