"""What a template shows its audience: never an image they may not use (sharing or publishing
such a template is refused, and what is shown anyway leaves the image out), its owner's own
inactive templates, and names that tell nothing of others' templates."""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management import call_command

from environments import services
from environments.models import EnvironmentTemplate
from provisioning import owned
from tests import images
from tests.environments.conftest import member
from tests.images import image_maintainer

pytestmark = pytest.mark.django_db

URL = "/api/v1/environments/"


@pytest.fixture
def lab(alice, bob):
    group = Group.objects.create(name="lab")
    alice.groups.add(group)
    bob.groups.add(group)
    return group


@pytest.fixture
def maya(lab):
    return image_maintainer(lab)


@pytest.fixture
def secret(alice):
    """Alice's capture: restricted, no group, hers alone."""
    return images.sim_image("alice-secret-capture", owner=alice, visibility="restricted")


@pytest.fixture
def with_secret(alice, secret, debian, make_template):
    return make_template(
        alice,
        [member("gw", debian, "lan", entry=True), member("box", secret, "lan")],
        [{"name": "lan", "cidr": ""}],
        name="t1",
    )


def test_sharing_a_template_whose_image_its_groups_may_not_use_is_refused_naming_it(with_secret, maya, lab):
    with pytest.raises(ValidationError) as refused:
        services.share_template(with_secret, [lab], actor=maya)
    assert "alice-secret-capture" in str(refused.value) and "debian-12" not in str(refused.value)
    with_secret.refresh_from_db()
    assert not with_secret.groups.exists()


def test_once_the_image_is_shared_with_the_group_the_template_may_be(with_secret, secret, maya, lab, bob):
    owned.share(secret, [lab], actor=maya)
    services.share_template(with_secret, [lab], actor=maya)
    assert services.visible_templates(bob).filter(pk=with_secret.pk).exists()


def test_making_it_public_is_refused_while_an_image_is_not_public(with_secret, secret, admin_user, make_template):
    with pytest.raises(ValidationError, match="alice-secret-capture"):
        services.update_template(with_secret, actor=admin_user, visibility="public")
    with pytest.raises(ValidationError, match="alice-secret-capture"):
        make_template(admin_user, [member("a", secret, entry=True)], visibility="public")
    assert EnvironmentTemplate.objects.get(pk=with_secret.pk).visibility == "restricted"


def test_a_public_templates_members_cannot_become_a_private_image(alice, admin_user, debian, secret, make_template):
    template = make_template(alice, [member("a", debian, entry=True)])
    services.update_template(template, actor=admin_user, visibility="public")
    with pytest.raises(ValidationError, match="alice-secret-capture"):
        services.update_template(template, actor=alice, members=[member("a", secret, entry=True)])


def test_the_api_refuses_the_share_with_the_images_name(api, with_secret, maya, lab):
    response = api(maya).post(f"{URL}{with_secret.pk}/share/", {"groups": [lab.pk]}, format="json")
    assert response.status_code == 400 and "alice-secret-capture" in response.json()["error"]["message"]


@pytest.fixture
def leaked(with_secret, lab):
    """A template shared before sharing checked its images (or an image taken back since)."""
    with_secret.groups.set([lab])
    return with_secret


def test_the_api_leaves_out_an_image_the_reader_may_not_see(api, leaked, alice, bob, secret, debian):
    box = next(m for m in api(bob).get(f"{URL}{leaked.pk}/").json()["members"] if m["name"] == "box")
    assert box["image"] is None and box["image_name"] is None
    gw = next(m for m in api(bob).get(f"{URL}{leaked.pk}/").json()["members"] if m["name"] == "gw")
    assert gw["image"] == debian.pk and gw["image_name"] == "debian-12"
    mine = next(m for m in api(alice).get(f"{URL}{leaked.pk}/").json()["members"] if m["name"] == "box")
    assert mine["image"] == secret.pk and mine["image_name"] == "alice-secret-capture"
    assert "alice-secret-capture" not in api(bob).get(URL).content.decode()


def test_the_page_leaves_out_an_image_the_reader_may_not_see(client, leaked, alice, bob):
    client.force_login(bob)
    page = client.get(f"/environments/{leaked.pk}/").content.decode()
    assert "not visible to you" in page and "alice-secret-capture" not in page and "debian-12" in page
    client.force_login(alice)
    assert "alice-secret-capture" in client.get(f"/environments/{leaked.pk}/").content.decode()


def test_the_cli_shows_it_as_a_user_sees_it(leaked, bob):
    def show(*args):
        out = StringIO()
        call_command("environment", "show", "t1", *args, stdout=out)
        return out.getvalue()

    assert "alice-secret-capture" in show()
    assert "alice-secret-capture" not in show("--user", "bob") and "not visible" in show("--user", "bob")
    members = json.loads(show("--user", "bob", "--json"))["members"]
    assert next(m for m in members if m["name"] == "box")["image_name"] is None


def test_an_owner_who_switches_a_template_off_still_has_it(api, alice, bob, lab, maya, debian, make_template):
    template = make_template(alice, [member("a", debian, entry=True)], name="mine")
    services.share_template(template, [lab], actor=maya)
    assert api(alice).patch(f"{URL}{template.pk}/", {"active": False}, format="json").status_code == 200
    assert api(alice).get(f"{URL}{template.pk}/").json()["active"] is False
    assert api(bob).get(f"{URL}{template.pk}/").status_code == 404  # its group: not while it is off
    assert "mine" not in [t["name"] for t in api(bob).get(URL).json()["results"]]
    assert api(alice).patch(f"{URL}{template.pk}/", {"active": True}, format="json").status_code == 200
    assert api(bob).get(f"{URL}{template.pk}/").status_code == 200
    services.update_template(template, actor=alice, active=False)
    assert api(alice).delete(f"{URL}{template.pk}/").status_code == 204


def test_staff_see_an_inactive_template(api, alice, admin_user, debian, make_template):
    template = make_template(alice, [member("a", debian, entry=True)], active=False)
    assert api(admin_user).get(f"{URL}{template.pk}/").status_code == 200


def test_the_owner_resends_public_unchanged(api, alice, admin_user, debian, make_template):
    template = make_template(alice, [member("a", debian, entry=True)], name="pub")
    services.update_template(template, actor=admin_user, visibility="public")
    response = api(alice).patch(f"{URL}{template.pk}/", {"description": "x", "visibility": "public"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["description"] == "x"


def test_a_refusal_says_the_services_words(api, alice, debian, make_template):
    template = make_template(alice, [member("a", debian, entry=True)])
    response = api(alice).patch(f"{URL}{template.pk}/", {"visibility": "public"}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "only administrators make a template public"


def test_a_name_another_user_has_is_free(api, alice, bob, debian, make_template):
    make_template(alice, [member("a", debian, entry=True)], name="hidden-exam-lab")
    body = {"name": "hidden-exam-lab", "members": [{"name": "a", "image": debian.pk, "entry": True}]}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 201, response.json()
    again = api(bob).post(URL, body, format="json")
    assert again.status_code == 400 and "you have a template of this name already" in again.json()["error"]["message"]
    assert "alice" not in again.content.decode()


def test_the_admin_refuses_the_share_on_its_form(client, admin_user, with_secret, lab):
    from tests.environments.test_pages import _empty_inline

    client.force_login(admin_user)
    url = f"/admin/environments/environmenttemplate/{with_secret.pk}/change/"
    form = {
        "name": "t1",
        "description": "",
        "visibility": "restricted",
        "groups": [lab.pk],
        "active": "on",
        **{f"{prefix}-{key}": value for prefix in ("networks", "members") for key, value in _empty_inline().items()},
    }
    response = client.post(url, form)
    assert response.status_code == 200 and "alice-secret-capture" in response.content.decode()
    assert not with_secret.groups.exists()
    form["visibility"] = "public"
    form["groups"] = []
    assert "alice-secret-capture" in client.post(url, form).content.decode()
    with_secret.refresh_from_db()
    assert with_secret.visibility == "restricted"


def test_a_revision_under_test_is_not_shared_with_a_group(make_template, debian, maya, lab):
    from provisioning import services as vms
    from tests.environments.test_rules import revision_under_test

    revision = revision_under_test(debian)
    vms.update_image(debian, actor="test", groups=[lab])
    template = make_template(maya, [member("a", debian, entry=True, revision=revision.number)])
    with pytest.raises(ValidationError, match="debian-12"):
        services.share_template(template, [lab], actor=maya)
    services.update_template(template, actor=maya, members=[member("a", debian, entry=True)])
    services.share_template(template, [lab], actor=maya)  # its production revision: theirs to use
    assert list(template.groups.all()) == [lab]
