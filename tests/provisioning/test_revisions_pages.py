"""The image page's revisions: everyone who sees the image sees them; its maintainers act on them."""

import pytest

from provisioning import revisions, services

pytestmark = pytest.mark.django_db


def test_users_see_the_revisions_without_the_actions(client, alice, image):
    services.add_revision(
        image, actor="test", comment="patched", variants=[{"hypervisor_type": "sim", "format": "sim", "location": "x"}]
    )
    client.force_login(alice)
    html = client.get(f"/vms/images/{image.pk}/").content.decode()
    assert 'id="revisions"' in html and "patched" in html and "<strong>production</strong>" in html
    assert "make production" not in html and "Add a revision" not in html


def test_a_plain_user_cannot_act_on_revisions(client, alice, image):
    client.force_login(alice)
    response = client.post(f"/vms/revisions/{revisions.production(image).pk}/retire/")
    assert response.status_code == 403
    assert revisions.production(image).state == "production"


def test_staff_add_roll_out_roll_back_and_delete_from_the_page(client, admin_user, image):
    client.force_login(admin_user)
    response = client.post(
        f"/vms/images/{image.pk}/revisions/",
        {
            "revision-hypervisor_type": "sim",
            "revision-format": "sim",
            "revision-location": "sim://library/v2",
            "revision-size_gib": 2,
            "revision-comment": "patched",
        },
    )
    assert response.status_code == 302
    first, second = image.revisions.order_by("number")
    assert (second.state, second.comment) == ("testing", "patched")

    client.post(f"/vms/revisions/{second.pk}/production/")
    assert revisions.production(image) == second
    html = client.get(f"/vms/images/{image.pk}/").content.decode()
    assert f"/vms/revisions/{first.pk}/production/" in html and f"/vms/revisions/{second.pk}/production/" not in html

    client.post(f"/vms/revisions/{first.pk}/production/")  # the roll-back
    client.post(f"/vms/revisions/{second.pk}/delete/")
    assert list(image.revisions.values_list("number", "state")) == [(1, "production")]

    refused = client.post(f"/vms/revisions/{first.pk}/delete/", follow=True)
    assert "make another one production first" in refused.content.decode()
    assert client.post(f"/vms/revisions/{first.pk}/explode/").status_code == 404
