"""The image revisions API: users read the revisions of the images they may use; image
maintainers of the image's groups and administrators add, make production, retire, delete."""

import pytest
from django.contrib.auth.models import Group

from provisioning import revisions, services
from provisioning.models import ImageRevision
from tests.images import image_maintainer

DISK = {"hypervisor_type": "sim", "format": "sim", "location": "sim://library/v2"}


@pytest.fixture
def lab(db):
    """A restricted image of the group ``lab``."""
    group = Group.objects.create(name="lab")
    image = services.create_image(actor="test", name="lab-image", visibility="restricted", groups=[group])
    services.add_variant(image, actor="test", hypervisor_type="sim", format="sim", location="sim://library/lab")
    return image


@pytest.fixture
def maintainer(lab):
    return image_maintainer(Group.objects.get(name="lab"))


def numbers(response):
    assert response.status_code == 200, response.json()
    return [(item["image"], item["number"], item["state"]) for item in response.json()["results"]]


def test_users_see_the_revisions_of_the_images_they_may_use(api, alice, admin_user, image, lab):
    assert numbers(api(alice).get("/api/v1/image-revisions/")) == [(image.pk, 1, "production")]
    assert api(alice).get(f"/api/v1/image-revisions/{revisions.production(lab).pk}/").status_code == 404
    assert len(numbers(api(admin_user).get("/api/v1/image-revisions/"))) == 2
    assert "location" not in api(alice).get("/api/v1/image-revisions/").json()["results"][0]["variants"][0]


def test_a_plain_user_cannot_change_revisions(api, alice, image):
    first = revisions.production(image)
    second = services.add_revision(image, actor="test", variants=[DISK])
    client = api(alice)
    assert (
        client.post("/api/v1/image-revisions/", {"image": image.pk, "disks": [DISK]}, format="json").status_code == 403
    )
    assert client.post(f"/api/v1/image-revisions/{second.pk}/make-production/").status_code == 403
    assert client.post(f"/api/v1/image-revisions/{first.pk}/retire/").status_code == 403
    assert client.delete(f"/api/v1/image-revisions/{second.pk}/").status_code == 403
    assert revisions.production(image) == first and ImageRevision.objects.filter(pk=second.pk).exists()


def test_a_maintainer_changes_only_their_groups_images(api, maintainer, image, lab):
    client = api(maintainer)
    public = client.post("/api/v1/image-revisions/", {"image": image.pk, "disks": [DISK]}, format="json")
    assert public.status_code == 403

    made = client.post(
        "/api/v1/image-revisions/", {"image": lab.pk, "disks": [DISK], "comment": "patched"}, format="json"
    )

    assert made.status_code == 201, made.json()
    assert (made.json()["number"], made.json()["state"], made.json()["created_by"]) == (2, "testing", "maya")
    assert made.json()["variants"][0]["hypervisor_type"] == "sim"


def test_roll_out_roll_back_retire_and_delete(api, admin_user, image):
    client = api(admin_user)
    first = revisions.production(image)
    made = client.post("/api/v1/image-revisions/", {"image": image.pk, "disks": [DISK]}, format="json").json()

    response = client.post(f"/api/v1/image-revisions/{made['id']}/make-production/")
    assert response.status_code == 200 and response.json()["state"] == "production"
    assert client.post(f"/api/v1/image-revisions/{made['id']}/make-production/").status_code == 409
    assert client.post(f"/api/v1/image-revisions/{made['id']}/retire/").status_code == 409
    assert client.delete(f"/api/v1/image-revisions/{made['id']}/").status_code == 409

    assert client.post(f"/api/v1/image-revisions/{first.pk}/make-production/").json()["state"] == "production"
    assert client.post(f"/api/v1/image-revisions/{made['id']}/retire/").json()["state"] == "retired"
    assert client.delete(f"/api/v1/image-revisions/{made['id']}/").status_code == 204
    assert list(image.revisions.values_list("number", "state")) == [(1, "production")]


def test_bad_input_is_refused_with_the_field(api, admin_user, image, lab):
    client = api(admin_user)
    for body, field in (
        ({"image": image.pk, "disks": []}, "disks"),
        ({"image": image.pk, "disks": [{**DISK, "format": "nope"}]}, "disks"),
        ({"image": image.pk, "disks": [{**DISK, "colour": "red"}]}, "disks"),
        ({"image": image.pk, "disks": [DISK, DISK]}, "hypervisor_type"),
        ({"image": image.pk, "disks": [DISK], "parent": revisions.production(lab).pk}, "parent"),
        ({"image": image.pk, "disks": [DISK], "state": "production", "number": 7}, None),
    ):
        response = client.post("/api/v1/image-revisions/", body, format="json")
        if field is None:  # read-only fields sent are ignored: a testing revision, numbered next
            assert response.status_code == 201 and response.json()["state"] == "testing", response.json()
            continue
        assert response.status_code == 400 and field in str(response.json()), (body, response.json())
    assert image.revisions.count() == 2


def test_an_image_shows_its_production_variants_only(api, admin_user, image):
    services.add_revision(image, actor="test", variants=[{**DISK, "format": "sim"}])
    client = api(admin_user)
    listed = client.get("/api/v1/images/").json()["results"][0]["variants"]
    updated = client.patch(f"/api/v1/images/{image.pk}/", {"description": "new"}, format="json").json()["variants"]
    assert listed == updated == [{"hypervisor_type": "sim", "format": "sim", "size_gib": 2}]
