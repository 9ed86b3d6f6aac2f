"""The API's filters: a list refuses a boolean filter it cannot read; one object's route reads none."""

import pytest

from provisioning.models import Image


@pytest.fixture
def images(db):
    return Image.objects.create(name="live"), Image.objects.create(name="retired", active=False)


def test_a_list_filters_and_refuses_a_boolean_it_cannot_read(api, admin_user, images):
    client = api(admin_user)
    names = [row["name"] for row in client.get("/api/v1/images/?active=false").json()["results"]]
    assert names == ["retired"]
    refused = client.get("/api/v1/images/?active=maybe")
    assert refused.status_code == 400
    assert "must be true or false" in refused.content.decode()


def test_one_objects_route_answers_whatever_list_filter_is_sent(api, admin_user, images):
    live, _ = images
    client = api(admin_user)
    for query in ("active=false", "active=maybe", "platform=nowhere"):
        response = client.get(f"/api/v1/images/{live.pk}/?{query}")
        assert response.status_code == 200, query
        assert response.json()["name"] == "live"
