"""A block whose seats are an environment, made from the blocks page and the API as from the
service: its image is the entry machine's (it may be left out), and only a template its maker
may use is taken."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from accounts import access
from reservations import services
from reservations.models import BlockAllocation, Reservation
from tests.environments.conftest import debian, make_template, member, router_image  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def course(alice):
    """cs101, which alice teaches."""
    group = Group.objects.create(name="cs101")
    group.user_set.add(alice)
    access.set_roles(alice, ["instructor"], actor=alice)
    return group


@pytest.fixture
def pair(alice, debian, router_image, make_template):  # noqa: F811 (fixtures)
    return make_template(
        alice,
        [member("router", router_image, "lan", entry=True), member("client", debian, "lan")],
        [{"name": "lan", "cidr": "192.168.40.0/24"}],
        name="pair",
    )


@pytest.fixture
def bobs(bob, debian, make_template):  # noqa: F811 (fixtures)
    """bob's template, his alone."""
    return make_template(bob, [member("only", debian, entry=True)], name="bobs")


def tomorrow():
    start = (timezone.now() + timedelta(days=1)).replace(hour=10, minute=0, second=0, microsecond=0)
    return start, start + timedelta(hours=2)


def form(course, **fields):
    start, end = tomorrow()
    return {"name": "lab", "group": course.pk, "seats": 2, "weeks": 1, "start": f"{start:%Y-%m-%dT%H:%M}",
            "end": f"{end:%Y-%m-%dT%H:%M}", **fields}  # fmt: skip


def test_the_blocks_page_makes_a_block_of_an_environment(client, make_host, course, pair, alice):
    make_host("big", cpus=16, memory_mib=16384)
    client.force_login(alice)
    assert f'<option value="{pair.pk}">pair</option>' in client.get("/reservations/blocks/").content.decode()
    response = client.post("/reservations/blocks/", form(course, environment=pair.pk))
    assert response.status_code == 302, response.content.decode()[-3000:]
    block = BlockAllocation.objects.get()
    assert block.environment == pair and block.image == pair.members.get(entry=True).image
    assert Reservation.objects.filter(block=block).count() == 4  # 2 seats × 2 machines


def test_the_page_offers_and_takes_only_templates_its_maker_may_use(client, make_host, course, pair, bobs, alice):
    make_host("big", cpus=16, memory_mib=16384)
    client.force_login(alice)
    assert f'<option value="{bobs.pk}">bobs<' not in client.get("/reservations/blocks/").content.decode()
    html = client.post("/reservations/blocks/", form(course, environment=bobs.pk)).content.decode()
    assert "Select a valid choice" in html and not BlockAllocation.objects.exists()
    html = client.post("/reservations/blocks/", form(course)).content.decode()
    assert "give an image or an environment" in html


def test_the_api_makes_a_block_of_an_environment_and_refuses_anothers(api, make_host, course, pair, bobs, alice):
    make_host("big", cpus=16, memory_mib=16384)
    start, end = tomorrow()
    body = {"name": "lab", "group": "cs101", "seats": 1, "start": start.isoformat(), "end": end.isoformat()}
    refused = api(alice).post("/api/v1/block-allocations/", {**body, "environment": bobs.pk}, format="json")
    assert refused.status_code == 400 and not BlockAllocation.objects.exists()
    assert "does not exist" in str(refused.json())  # as for an id no template has
    made = api(alice).post("/api/v1/block-allocations/", {**body, "environment": pair.pk}, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["environment"] == pair.pk and made.json()["image"] == pair.members.get(entry=True).image_id
    assert Reservation.objects.filter(block_id=made.json()["id"]).count() == 2


def test_the_service_refuses_a_template_its_maker_may_not_use(make_host, course, bobs, alice):
    make_host("big", cpus=16, memory_mib=16384)
    start, end = tomorrow()
    with pytest.raises(ValidationError) as refused:
        services.create_block(actor=alice, created_by=alice, name="lab", image=None, group=course, seats=1,
                              start=start, end=end, environment=bobs)  # fmt: skip
    assert refused.value.message_dict == {"environment": ["no such environment, or you may not use it"]}
