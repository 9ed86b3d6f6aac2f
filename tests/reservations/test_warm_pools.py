"""Warm pools for reservations on the simulator: an image's sizes, the pool filled by its round,
a reservation taking a warm VM (or built cold when none is warm, or when the warm start fails),
a warm VM's claim yielding to a reservation, and the pool's metrics."""

import pytest
from django.core.exceptions import ValidationError

from provisioning import services as vms

pytestmark = pytest.mark.django_db
URL = "/api/v1/images/"


def test_it_rejects_a_minimum_above_the_maximum(image):
    with pytest.raises(ValidationError) as refused:
        vms.update_image(image, actor="test", warm_min=3, warm_max=2)
    assert refused.value.message_dict["warm_max"] == ["must be at least the minimum (3)"]


def test_it_rejects_a_warm_pool_on_an_image_that_reverts_on_end(image):
    with pytest.raises(ValidationError) as refused:
        vms.update_image(image, actor="test", revert_on_end=True, warm_min=1, warm_max=1)
    assert "reuses its parked VMs" in refused.value.message_dict["warm_max"][0]


def test_an_admin_sets_the_sizes_through_the_api_and_a_user_only_reads_them(api, admin_user, alice, image):
    response = api(admin_user).patch(f"{URL}{image.pk}/", {"warm_min": 1, "warm_max": 2}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["warm_min"], response.json()["warm_max"]) == (1, 2)
    assert api(alice).patch(f"{URL}{image.pk}/", {"warm_max": 50}, format="json").status_code == 403
    image.refresh_from_db()
    assert (image.warm_min, image.warm_max) == (1, 2)
    assert api(alice).get(f"{URL}{image.pk}/").json()["warm_max"] == 2
    refused = api(admin_user).patch(f"{URL}{image.pk}/", {"warm_min": 3}, format="json")
    assert refused.status_code == 400 and "warm_max" in refused.json()["error"]["fields"]
