"""The image API for owned images: who sees them, sharing, renaming and deleting through it."""

import pytest

from provisioning.models import Image
from tests.provisioning.test_owned import lab, maya, mine  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def names(response):
    return [row["name"] for row in response.json()["results"]]


def test_an_owner_reads_their_image_at_once_and_others_do_not(api, mine, alice, bob):  # noqa: F811
    assert api(alice).get(f"/api/v1/images/{mine.pk}/").json()["owner"] == alice.pk
    assert "alice-work" in names(api(alice).get("/api/v1/images/"))
    assert api(bob).get(f"/api/v1/images/{mine.pk}/").status_code == 404
    assert "alice-work" not in names(api(bob).get("/api/v1/images/"))


def test_a_maintainer_shares_it_with_their_group_and_its_members_see_it(api, mine, alice, bob, maya, lab):  # noqa: F811
    lab.user_set.add(bob)
    url = f"/api/v1/images/{mine.pk}/share/"
    assert api(alice).post(url, {"groups": [lab.pk]}, format="json").status_code == 403  # owners do not share
    response = api(maya).post(url, {"groups": [lab.pk]}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["groups"] == [lab.pk] and response.json()["visibility"] == "restricted"
    assert api(bob).get(f"/api/v1/images/{mine.pk}/").status_code == 200


def test_sharing_with_a_group_not_ones_own_is_forbidden(api, mine, maya):  # noqa: F811
    from django.contrib.auth.models import Group

    other = Group.objects.create(name="other-course")
    response = api(maya).post(f"/api/v1/images/{mine.pk}/share/", {"groups": [other.pk]}, format="json")
    assert response.status_code == 403 and not mine.groups.exists()


def test_an_owner_renames_and_deletes_through_the_api(api, mine, alice, bob):  # noqa: F811
    assert api(bob).post(f"/api/v1/images/{mine.pk}/rename/", {"name": "x"}, format="json").status_code == 404
    response = api(alice).post(f"/api/v1/images/{mine.pk}/rename/", {"name": "alice-lab"}, format="json")
    assert response.status_code == 200 and response.json()["name"] == "alice-lab"
    bad = api(alice).post(f"/api/v1/images/{mine.pk}/rename/", {"name": "two words"}, format="json")
    assert bad.status_code == 400 and "name" in bad.json()["error"]["fields"]
    assert api(bob).delete(f"/api/v1/images/{mine.pk}/").status_code == 404
    assert api(alice).delete(f"/api/v1/images/{mine.pk}/").status_code == 204
    assert not Image.objects.filter(pk=mine.pk).exists()


def test_a_user_still_cannot_delete_an_image_they_do_not_own(api, image, alice):
    assert api(alice).delete(f"/api/v1/images/{image.pk}/").status_code == 403
    assert Image.objects.filter(pk=image.pk).exists()
