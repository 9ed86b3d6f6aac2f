"""The environments API: who sees which template, writing one with its members and networks in
the body, and the refusals the services give."""

import pytest

from environments.models import EnvironmentTemplate

pytestmark = pytest.mark.django_db

URL = "/api/v1/environments/"


def names(response):
    return [row["name"] for row in response.json()["results"]]


def body(image, **fields):
    return {
        "name": "dblab",
        "description": "Three database nodes and a client.",
        "members": [
            {"name": "db", "image": image.pk, "count": 3},
            {"name": "client", "image": image.pk, "entry": True, "memory_mib": 1024},
        ],
        "networks": [{"name": "backend"}],
        **fields,
    }


def attached(payload):
    for member in payload["members"]:
        member["networks"] = ["backend"]
    return payload


def test_a_user_creates_a_template_with_its_members_and_networks_in_the_body(api, alice, debian):
    response = api(alice).post(URL, attached(body(debian)), format="json")
    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["owner"] == alice.pk and data["visibility"] == "restricted" and data["machines"] == 4
    client = next(m for m in data["members"] if m["name"] == "client")
    assert client == {
        "name": "client",
        "count": 1,
        "vcpus": 1,
        "memory_mib": 1024,
        "disk_gib": 5,
        "entry": True,
        "image": debian.pk,
        "image_name": "debian-12",
        "revision": None,
        "networks": ["backend"],
    }
    assert data["networks"] == [{"name": "backend", "cidr": "192.168.0.0/24"}]


def test_a_broken_rule_is_a_400_naming_it(api, alice, debian):
    response = api(alice).post(URL, body(debian), format="json")  # nobody on the network
    assert response.status_code == 400
    assert "member db is on no network" in " ".join(response.json()["error"]["fields"]["members"])
    assert not EnvironmentTemplate.objects.exists()


def test_a_member_without_an_image_is_refused(api, alice, debian):
    payload = attached(body(debian))
    payload["members"][0]["image"] = None
    response = api(alice).post(URL, payload, format="json")
    assert response.status_code == 400
    assert "Choose an image." in str(response.json()["error"])
    assert not EnvironmentTemplate.objects.exists()


def test_a_user_never_sees_another_users_private_template_and_staff_see_all(api, alice, bob, admin_user, netlab):
    assert names(api(alice).get(URL)) == ["netlab"]
    assert names(api(bob).get(URL)) == []
    assert api(bob).get(f"{URL}{netlab.pk}/").status_code == 404
    assert api(bob).delete(f"{URL}{netlab.pk}/").status_code == 404
    assert names(api(admin_user).get(URL)) == ["netlab"]
    assert api(admin_user).get(f"{URL}{netlab.pk}/").json()["machines"] == 4


def test_a_public_template_is_everyones_to_read_and_only_its_owners_to_change(api, admin_user, alice, bob, netlab):
    assert api(alice).patch(f"{URL}{netlab.pk}/", {"visibility": "public"}, format="json").status_code == 403
    response = api(admin_user).patch(f"{URL}{netlab.pk}/", {"visibility": "public"}, format="json")
    assert response.status_code == 200 and response.json()["machines"] == 4  # a PATCH keeps what it leaves out
    assert len(response.json()["networks"]) == 2
    assert names(api(bob).get(URL)) == ["netlab"]
    assert api(bob).patch(f"{URL}{netlab.pk}/", {"description": "x"}, format="json").status_code == 403
    assert api(bob).delete(f"{URL}{netlab.pk}/").status_code == 403


def test_the_owner_replaces_the_members_and_deletes_it(api, alice, netlab, debian):
    url = f"{URL}{netlab.pk}/"
    members = [{"name": "only", "image": debian.pk, "entry": True}]
    response = api(alice).patch(url, {"members": members, "networks": []}, format="json")
    assert response.status_code == 200, response.json()
    assert [m["name"] for m in response.json()["members"]] == ["only"] and response.json()["networks"] == []
    assert api(alice).delete(url).status_code == 204
    assert not EnvironmentTemplate.objects.exists()


def test_an_image_the_owner_may_not_use_is_refused_without_saying_whether_it_exists(api, alice, bob, debian):
    from provisioning import services as vms

    hidden = vms.create_image(actor="test", name="bobs", visibility="restricted", owner=bob)
    for pk in (hidden.pk, 10**12):
        payload = {"name": "x", "members": [{"name": "a", "image": pk, "entry": True}]}
        response = api(alice).post(URL, payload, format="json")
        assert response.status_code == 400
        assert response.json()["error"]["fields"]["members"] == ["member a: no such image, or its owner may not use it"]


def test_a_read_token_cannot_write(api, alice, debian):
    assert api(alice, write=False).post(URL, attached(body(debian)), format="json").status_code == 403


def test_a_maintainer_shares_it_with_their_group(api, alice, bob, netlab):
    from django.contrib.auth.models import Group

    from tests.images import image_maintainer

    lab = Group.objects.create(name="lab")
    maya = image_maintainer(lab)
    alice.groups.add(lab)
    bob.groups.add(lab)
    share = f"{URL}{netlab.pk}/share/"
    assert api(alice).post(share, {"groups": [lab.pk]}, format="json").status_code == 403
    response = api(maya).post(share, {"groups": [lab.pk]}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["groups"] == [lab.pk]
    assert names(api(bob).get(URL)) == ["netlab"]
