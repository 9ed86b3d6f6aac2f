"""Pages for owned images: "My images", sharing by a maintainer, renaming and deleting by the owner."""

import pytest

from provisioning.models import Image
from tests.provisioning.test_owned import lab, maya, mine  # noqa: F401 (fixtures)
from tests.provisioning.test_pages import page

pytestmark = pytest.mark.django_db


def test_my_images_lists_the_users_own_images_only(client, mine, image, alice, bob):  # noqa: F811
    shown = page(client, alice, "/vms/images/")
    assert 'id="my-images"' in shown and f'id="my-image-{mine.pk}"' in shown
    assert f'id="my-image-{image.pk}"' not in shown  # the library's, not hers
    assert 'id="my-images"' not in page(client, bob, "/vms/images/")


def test_a_maintainer_shares_from_the_image_page(client, mine, alice, bob, maya, lab):  # noqa: F811
    lab.user_set.add(bob)
    assert 'id="share-form"' not in page(client, alice, f"/vms/images/{mine.pk}/")
    assert 'id="share-form"' in page(client, maya, f"/vms/images/{mine.pk}/")
    client.force_login(alice)
    assert client.post(f"/vms/images/{mine.pk}/share/", {"groups": [lab.pk]}).status_code == 403
    page(client, bob, f"/vms/images/{mine.pk}/", status=404)
    client.force_login(maya)
    response = client.post(f"/vms/images/{mine.pk}/share/", {"groups": [lab.pk]}, follow=True)
    assert "shared with lab" in response.content.decode()
    assert "alice-work" in page(client, bob, f"/vms/images/{mine.pk}/")


def test_an_owner_renames_and_deletes_from_the_image_page(client, mine, alice, bob):  # noqa: F811
    shown = page(client, alice, f"/vms/images/{mine.pk}/")
    assert 'id="rename-form"' in shown and 'id="delete-own"' in shown and 'id="image-owner"' in shown
    client.force_login(bob)
    assert client.post(f"/vms/images/{mine.pk}/rename/", {"name": "bobs"}).status_code == 404
    client.force_login(alice)
    bad = client.post(f"/vms/images/{mine.pk}/rename/", {"name": "two words"}, follow=True).content.decode()
    assert "name:" in bad and Image.objects.get(pk=mine.pk).name == "alice-work"
    client.post(f"/vms/images/{mine.pk}/rename/", {"name": "alice-lab"})
    assert Image.objects.get(pk=mine.pk).name == "alice-lab"
    client.force_login(bob)
    assert client.post(f"/vms/images/{mine.pk}/delete/").status_code == 403
    client.force_login(alice)
    assert client.post(f"/vms/images/{mine.pk}/delete/").status_code == 302
    assert not Image.objects.filter(pk=mine.pk).exists()


def test_the_share_form_offers_classes_not_the_groups_that_give_a_role(client, mine, admin_user, lab):  # noqa: F811
    from django.contrib.auth.models import Group

    from provisioning.forms import ShareForm

    Group.objects.get_or_create(name="operator")
    offered = {group.name for group in ShareForm(user=admin_user).fields["groups"].queryset}
    assert "lab" in offered and "operator" not in offered
    assert "image-maintainer" not in offered
