"""Reservations in the user's time zone: forms read local input, pages show local times with the
zone's abbreviation, weekly blocks keep their local hour across a change of daylight saving
time, and the API speaks UTC whatever the user's zone."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.cache import cache

from accounts import preferences
from reservations import services
from reservations.models import BlockAllocation, Reservation

BERLIN = ZoneInfo("Europe/Berlin")
H = timedelta(hours=1)
#: Before Europe's change from CET to CEST on 2027-03-28.
BEFORE_DST = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _no_cached_zones():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def teacher(django_user_model):
    user = django_user_model.objects.create_user("ivy", "ivy@example.org", "ivy-pass-1")
    user.user_permissions.add(Permission.objects.get(codename="add_blockallocation"))
    preferences.set_time_zone(user, "Europe/Berlin", actor=user)
    user.groups.add(Group.objects.create(name="cs101"))
    return user


def seat_starts(block):
    starts = Reservation.objects.filter(block=block).order_by("occurrence").values_list("start", flat=True)
    return sorted(set(starts))


def test_a_weekly_block_keeps_its_local_hour_across_the_change_to_summer_time(sim_host, image, teacher, settings):
    settings.RESERVATION_HORIZON_DAYS = 400
    start = datetime(2027, 3, 22, 14, 0, tzinfo=BERLIN)  # Monday 14:00 CET = 13:00 UTC
    block = services.create_block(
        actor=teacher,
        name="CS101 lab",
        image=image,
        group=Group.objects.get(name="cs101"),
        seats=1,
        start=start,
        end=start + 2 * H,
        weeks=3,
        created_by=teacher,
        now=BEFORE_DST,
    )
    starts = seat_starts(block)
    assert [s.astimezone(BERLIN).strftime("%a %H:%M %Z") for s in starts] == [
        "Mon 14:00 CET",
        "Mon 14:00 CEST",
        "Mon 14:00 CEST",
    ]
    assert [s.astimezone(UTC).hour for s in starts] == [13, 12, 12]
    ends = Reservation.objects.filter(block=block).values_list("start", "end")
    assert {end - begin for begin, end in ends} == {2 * H}


def test_the_block_form_reads_the_instructors_local_time_and_the_page_shows_it(
    client, sim_host, image, teacher, settings, monkeypatch
):
    settings.RESERVATION_HORIZON_DAYS = 400
    client.force_login(teacher)
    page = client.get("/reservations/blocks/").content.decode()
    assert "Time zone Europe/Berlin" in page
    data = {
        "name": "CS101 lab",
        "image": image.pk,
        "group": Group.objects.get(name="cs101").pk,
        "seats": 1,
        "start": "2027-03-22T14:00",
        "end": "2027-03-22T16:00",
        "weeks": 2,
    }
    response = client.post("/reservations/blocks/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    block = BlockAllocation.objects.get()
    assert block.start == datetime(2027, 3, 22, 13, 0, tzinfo=UTC)
    assert [s.astimezone(UTC).hour for s in seat_starts(block)] == [13, 12]
    page = client.get("/reservations/blocks/").content.decode()
    assert "Mon 2027-03-22 14:00–16:00 CET" in page


def test_a_local_time_that_does_not_exist_is_refused_by_the_form(client, sim_host, image, teacher, settings):
    settings.RESERVATION_HORIZON_DAYS = 400
    client.force_login(teacher)
    data = {
        "name": "night lab",
        "image": image.pk,
        "group": Group.objects.get(name="cs101").pk,
        "seats": 1,
        "start": "2027-03-28T02:30",  # the clocks jump from 02:00 to 03:00
        "end": "2027-03-28T04:00",
        "weeks": 1,
    }
    html = client.post("/reservations/blocks/", data).content.decode()
    assert "it may be ambiguous or it may not exist" in html.split('id="error-start"')[1]
    assert not BlockAllocation.objects.exists()


def test_pages_show_reservations_in_the_users_zone(client, sim_host, image, alice):
    preferences.set_time_zone(alice, "Asia/Kolkata", actor=alice)
    reservation = services.reserve(alice, image, actor=alice, start=_next_hour() + 5 * H, duration=H)
    local = reservation.start.astimezone(ZoneInfo("Asia/Kolkata"))
    client.force_login(alice)
    listing = client.get("/reservations/").content.decode()
    assert f"{local:%Y-%m-%d %H:%M} IST" in listing
    home = client.get("/").content.decode()
    assert f"Wait: starts {local:%Y-%m-%d %H:%M} IST" in home and "(UTC)" not in home
    reserve = client.get("/reservations/new/").content.decode()
    assert 'Time zone Asia/Kolkata · <a href="/account/">change</a>' in reserve


def test_the_api_stays_utc_for_a_user_in_another_zone(sim_host, image, alice, api):
    preferences.set_time_zone(alice, "America/Los_Angeles", actor=alice)
    client = api(alice)
    start = _next_hour() + 5 * H
    # A datetime without an offset is read as UTC (DRF reads it in the active zone: UTC here).
    naive = start.astimezone(UTC).replace(tzinfo=None).isoformat()
    created = client.post(
        "/api/v1/reservations/", {"image": image.pk, "start": naive, "duration_minutes": 60}, format="json"
    )
    assert created.status_code == 201, created.content
    rid = created.json()["reservation"]["id"]
    assert Reservation.objects.get(pk=rid).start == start
    shown = client.get(f"/api/v1/reservations/{rid}/").json()["start"]
    assert shown == start.astimezone(UTC).isoformat().replace("+00:00", "Z"), shown


def _next_hour():
    now = datetime.now(UTC)
    return now.replace(minute=0, second=0, microsecond=0) + H


def test_the_api_takes_the_zone_whose_hour_the_weeks_keep(sim_host, image, teacher, api, settings):
    settings.RESERVATION_HORIZON_DAYS = 400
    client = api(teacher)
    body = {
        "name": "NYC lab",
        "image": image.pk,
        "group": "cs101",
        "seats": 1,
        "start": "2027-03-08T14:00:00Z",  # 09:00 EST, a week before the US change on 2027-03-14
        "end": "2027-03-08T15:00:00Z",
        "weeks": 2,
        "time_zone": "America/New_York",
    }
    assert client.post("/api/v1/block-allocations/", {**body, "time_zone": "Nowhere"}, format="json").status_code == 400
    created = client.post("/api/v1/block-allocations/", body, format="json")
    assert created.status_code == 201, created.content
    assert "time_zone" not in created.json()
    block = BlockAllocation.objects.get()
    assert [s.astimezone(UTC).hour for s in seat_starts(block)] == [14, 13]  # 09:00 EST, then 09:00 EDT
    # Without one, the teacher's own zone (Berlin: no change between these two weeks).
    del body["time_zone"]
    body["name"] = "default zone"
    assert client.post("/api/v1/block-allocations/", body, format="json").status_code == 201
    block = BlockAllocation.objects.get(name="default zone")
    assert [s.astimezone(UTC).hour for s in seat_starts(block)] == [14, 14]
