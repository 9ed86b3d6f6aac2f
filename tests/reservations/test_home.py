"""A signed-in user's home: only their own reservations and classes, each with its next action;
staff keep the dashboard with a link to the usage reports."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from reservations import home
from reservations.models import BlockAllocation, Reservation

pytestmark = pytest.mark.django_db
H = timedelta(hours=1)


def booked(user, image, status, start_in=0, error=""):
    start = timezone.now() + start_in * H
    return Reservation.objects.create(
        user=user,
        image=image,
        start=start,
        end=start + 2 * H,
        status=status,
        vcpus=1,
        memory_mib=256,
        disk_gib=1,
        error=error,
    )


def test_home_shows_only_the_users_own_reservations_with_the_next_action(client, image, alice, bob):
    ready = booked(alice, image, "ready")
    later = booked(alice, image, "pending", start_in=24)
    building = booked(alice, image, "provisioning")
    failed = booked(alice, image, "failed", error="no address after 300 s\nmore")
    ended = booked(alice, image, "ended")
    other = booked(bob, image, "ready")
    client.force_login(alice)
    page = client.get("/").content.decode()
    for r, verb in ((ready, "connect"), (later, "wait"), (building, "wait"), (failed, "why")):
        assert f'id="home-reservation-{r.pk}" data-action="{verb}"' in page
    assert f"home-reservation-{ended.pk}" not in page and f"home-reservation-{other.pk}" not in page
    assert f"/reservations/{ready.pk}/#connection" in page
    assert "See why it failed: no address after 300 s" in page and "more" not in page.split("See why")[1][:60]
    assert "Wait: the machine is being built" in page and "Wait: starts" in page
    assert client.get("/home/panel/").content.decode().count("home-reservation-") == 4


def test_home_lists_the_classes_of_the_users_groups_with_their_seat(client, image, alice, bob, admin_user):
    physics = Group.objects.create(name="physics")
    alice.groups.add(physics)
    start = timezone.now() + H
    block = BlockAllocation.objects.create(
        name="Physics lab", image=image, group=physics, seats=2, start=start, end=start + H, created_by=admin_user
    )
    seat = Reservation.objects.create(
        user=alice,
        image=image,
        start=start,
        end=start + H,
        status="pending",
        vcpus=1,
        memory_mib=256,
        disk_gib=1,
        block=block,
    )
    client.force_login(alice)
    page = client.get("/").content.decode()
    assert f'id="home-class-{block.pk}"' in page and f"/reservations/{seat.pk}/" in page
    client.force_login(bob)
    assert f"home-class-{block.pk}" not in client.get("/").content.decode()
    assert home.classes_of(bob) == []


def test_staff_keep_the_dashboard_with_a_link_to_usage(client, admin_user):
    client.force_login(admin_user)
    page = client.get("/").content.decode()
    assert 'id="admin-dashboard"' in page and 'href="/reservations/usage/"' in page
    assert 'id="home-panel"' not in page


def test_the_home_fragment_needs_a_login(client):
    assert client.get("/home/panel/").status_code == 302
