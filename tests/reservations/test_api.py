"""The reservations REST API: create, list own, detail, extend, end, cancel, check; blocks; quotas."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from capacity.models import Allocation
from provisioning.models import QuotaRule
from reservations import services
from reservations.models import BlockAllocation, Reservation
from tests.api_suite import ApiCrudSuite

URL = "/api/v1/reservations/"
H = timedelta(hours=1)


def iso(moment):
    return moment.isoformat()


def test_it_creates_now_with_202_and_the_job_url(sim_host, image, alice, api, sync_jobs):
    response = api(alice).post(URL, {"image": image.pk, "duration_minutes": 60}, format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["reservation"]["status"] == "provisioning" and body["job"]
    assert response["Location"] == body["job_url"] and body["job_url"].endswith(f"/api/v1/jobs/{body['job']}/")
    sync_jobs.drain()
    detail = api(alice).get(f"{URL}{body['reservation']['id']}/").json()
    assert detail["status"] == "ready" and detail["connection"]["password"]
    assert [h["status"] for h in detail["history"]] == ["pending", "provisioning", "ready"]


def test_a_future_one_is_201_and_can_be_canceled(sim_host, image, alice, api):
    start = timezone.now() + 5 * H
    response = api(alice).post(URL, {"image": image.pk, "start": iso(start), "end": iso(start + H)}, format="json")
    assert response.status_code == 201 and response.json()["job"] is None
    rid = response.json()["reservation"]["id"]
    response = api(alice).post(f"{URL}{rid}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "canceled"
    assert api(alice).post(f"{URL}{rid}/cancel/").status_code == 409


def test_bad_input_is_refused_per_field_and_nothing_is_created(sim_host, image, alice, api):
    now = timezone.now()
    cases = [
        ({"image": image.pk, "start": iso(now - 2 * H), "duration_minutes": 30}, "start", "in the past"),
        ({"image": image.pk, "start": iso(now + H), "end": iso(now)}, "end", "after the start"),
        ({"image": image.pk, "duration_minutes": 60 * 24}, "end", "at most 8 h"),
        ({"image": image.pk}, "end", "either end or duration_minutes"),
        ({"image": 99999, "duration_minutes": 30}, "image", "does not exist"),
    ]
    for body, field, text in cases:
        response = api(alice).post(URL, body, format="json")
        assert response.status_code == 400, body
        messages = " ".join(str(m) for m in response.json()["error"]["fields"].get(field, []))
        assert text in messages, response.json()
    assert not Reservation.objects.exists() and not Allocation.objects.exists()


def test_an_invisible_image_is_refused(sim_host, image, alice, api):
    from provisioning import services as vms

    vms.update_image(image, actor="test", visibility="restricted", groups=[Group.objects.create(name="staffonly")])
    response = api(alice).post(URL, {"image": image.pk, "duration_minutes": 30}, format="json")
    assert response.status_code == 400 and "may not use it" in str(response.json()["error"]["fields"]["image"])


def test_the_same_request_key_makes_one_reservation(sim_host, image, alice, api):
    body = {"image": image.pk, "duration_minutes": 60, "request_key": "k-1"}
    first = api(alice).post(URL, body, format="json")
    second = api(alice).post(URL, body, format="json")
    assert first.status_code == 202 and second.status_code == 200
    assert first.json()["reservation"]["id"] == second.json()["reservation"]["id"]
    assert Reservation.objects.count() == 1


def test_users_never_see_or_touch_each_others_reservations(sim_host, image, alice, bob, admin_user, api):
    mine = services.reserve(alice, image, actor=alice, start=timezone.now() + 5 * H, duration=H)
    assert api(bob).get(URL).json()["count"] == 0
    for method, path in (("get", ""), ("post", "extend/"), ("post", "end/"), ("post", "cancel/")):
        response = getattr(api(bob), method)(f"{URL}{mine.pk}/{path}", {"end": iso(mine.end + H)}, format="json")
        assert response.status_code == 404, path
    assert Reservation.objects.get(pk=mine.pk).status == "pending"
    staff_view = api(admin_user).get(f"{URL}{mine.pk}/").json()
    assert staff_view["user"] == "alice"
    assert api(admin_user).get(URL).json()["count"] == 1


def test_staff_never_get_the_users_password(sim_host, image, alice, admin_user, api, sync_jobs):
    reservation = services.reserve(alice, image, actor=alice, duration=H)
    sync_jobs.drain()
    assert api(alice).get(f"{URL}{reservation.pk}/").json()["connection"]["password"]
    assert "password" not in api(admin_user).get(f"{URL}{reservation.pk}/").json()["connection"]


def test_extend_and_end(sim_host, image, alice, bob, api, sync_jobs):
    reservation = services.reserve(alice, image, actor=alice, duration=H, size={"memory_mib": 4096})
    sync_jobs.drain()
    new_end = reservation.end + H
    response = api(alice).post(f"{URL}{reservation.pk}/extend/", {"end": iso(new_end)}, format="json")
    assert response.status_code == 200
    assert Reservation.objects.get(pk=reservation.pk).end == new_end
    services.reserve(bob, image, actor=bob, start=new_end, duration=H, size={"memory_mib": 6144})
    response = api(alice).post(f"{URL}{reservation.pk}/extend/", {"end": iso(new_end + H)}, format="json")
    assert response.status_code == 400 and "no host has room" in str(response.json()["error"]["fields"]["end"])
    response = api(alice).post(f"{URL}{reservation.pk}/end/")
    assert response.status_code == 202 and response.json()["reservation"]["status"] == "ending"
    sync_jobs.drain()
    assert Reservation.objects.get(pk=reservation.pk).status == "ended"
    assert api(alice).post(f"{URL}{reservation.pk}/end/").status_code == 409


def test_a_read_only_token_cannot_reserve(sim_host, image, alice, api):
    response = api(alice, write=False).post(URL, {"image": image.pk, "duration_minutes": 60}, format="json")
    assert response.status_code == 403 and not Reservation.objects.exists()


def test_anonymous_is_refused(api):
    assert api().get(URL).status_code in (401, 403)


def test_check_says_whether_it_fits_and_when(sim_host, image, alice, bob, api):
    first = services.reserve(alice, image, actor=alice, duration=2 * H, size={"memory_mib": 7000})
    response = api(bob).post(f"{URL}check/", {"image": image.pk, "duration_minutes": 60}, format="json")
    body = response.json()
    assert response.status_code == 200 and body["fits"] is False and "lack memory" in body["message"]
    assert body["earliest"].startswith(first.end.strftime("%Y-%m-%dT%H:%M"))
    later = api(bob).post(
        f"{URL}check/", {"image": image.pk, "start": iso(first.end), "duration_minutes": 60}, format="json"
    )
    assert later.json()["fits"] is True
    assert Reservation.objects.count() == 1


def cs101_block(image, seats, weeks):
    """The API body of a block for the group cs101: an hour a week from tomorrow."""
    start = timezone.now() + 24 * H
    return {
        "name": "CS101",
        "image": image.pk,
        "group": "cs101",
        "seats": seats,
        "start": iso(start),
        "end": iso(start + H),
        "weeks": weeks,
    }


def test_blocks_members_take_seats_others_cannot_create(sim_host, image, alice, bob, admin_user, api):
    klass = Group.objects.create(name="cs101")
    body = cs101_block(image, seats=2, weeks=2)
    assert api(alice).post("/api/v1/block-allocations/", body, format="json").status_code == 403
    response = api(admin_user).post("/api/v1/block-allocations/", body, format="json")
    assert response.status_code == 201, response.json()
    block_id = response.json()["id"]
    assert Reservation.objects.filter(block_id=block_id).count() == 4
    assert api(alice).get("/api/v1/block-allocations/").json()["count"] == 0
    alice.groups.add(klass)
    assert api(alice).get("/api/v1/block-allocations/").json()["count"] == 1
    seat = api(alice).post(f"/api/v1/block-allocations/{block_id}/take-seat/")
    assert seat.status_code == 200 and seat.json()["user"] == "alice"
    assert api(bob).post(f"/api/v1/block-allocations/{block_id}/take-seat/").status_code == 404


class TestQuotaRuleApi(ApiCrudSuite):
    url = "/api/v1/quota-rules/"

    def make(self):
        return QuotaRule.objects.create(name="default", max_duration_minutes=120)

    def create_payload(self):
        return {"name": "students", "max_per_user": 2}

    def update_payload(self, obj):
        return {"max_duration_minutes": 60}


@pytest.mark.parametrize("url", [URL, "/api/v1/block-allocations/"])
def test_list_query_budget(sim_host, image, alice, api, django_assert_max_num_queries, url):
    for _ in range(3):
        services.reserve(alice, image, actor=alice, start=timezone.now() + 5 * H, duration=H)
    client = api(alice)
    with django_assert_max_num_queries(12):
        assert client.get(url).status_code == 200


def test_an_instructor_cannot_cancel_another_instructors_block(sim_host, image, admin_user, api, django_user_model):
    from django.contrib.auth.models import Permission

    klass = Group.objects.create(name="cs101")
    body = cs101_block(image, seats=1, weeks=1)
    ivy, max_ = (django_user_model.objects.create_user(name) for name in ("ivy", "max"))
    for instructor in (ivy, max_):
        instructor.user_permissions.add(Permission.objects.get(codename="add_blockallocation"))
    ivy.groups.add(klass)  # max teaches another class: cs101's blocks are not his
    max_.groups.add(Group.objects.create(name="cs102"))
    block_id = api(ivy).post("/api/v1/block-allocations/", body, format="json").json()["id"]
    assert api(max_).post(f"/api/v1/block-allocations/{block_id}/cancel/").status_code == 404
    assert not BlockAllocation.objects.get(pk=block_id).canceled
    assert api(ivy).post(f"/api/v1/block-allocations/{block_id}/cancel/").status_code == 204
    assert BlockAllocation.objects.get(pk=block_id).canceled


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"start": "9999-12-31T23:00:00Z", "duration_minutes": 60}, "start"),
        ({"end": "9999-12-31T23:59:59Z"}, "end"),
        ({"duration_minutes": 10**12}, "duration_minutes"),
        ({"duration_minutes": 10**15}, "duration_minutes"),
    ],
    ids=["start-9999", "end-9999", "duration-1e12", "duration-1e15"],
)
def test_a_time_or_duration_past_any_calendar_is_a_400(sim_host, image, alice, api, body, field):
    response = api(alice).post(URL, {"image": image.pk, **body}, format="json")
    assert response.status_code == 400, response.content[:300]
    assert field in response.json()["error"]["fields"]
    assert not Reservation.objects.exists()


def test_extending_to_year_9999_is_a_400(sim_host, image, alice, api):
    start = timezone.now() + 5 * H
    reservation = services.reserve(alice, image, start=start, end=start + H, actor=alice)
    response = api(alice).post(f"{URL}{reservation.pk}/extend/", {"end": "9999-12-31T23:59:59Z"}, format="json")
    assert response.status_code == 400 and "end" in response.json()["error"]["fields"], response.content[:300]


def test_a_block_in_year_9999_is_a_400(sim_host, image, admin_user, api):
    group = Group.objects.create(name="class-9999")
    body = {
        "name": "far",
        "image": image.pk,
        "group": group.name,
        "seats": 1,
        "weeks": 52,
        "start": "9999-12-01T10:00:00Z",
        "end": "9999-12-01T12:00:00Z",
    }
    response = api(admin_user).post("/api/v1/block-allocations/", body, format="json")
    assert response.status_code == 400 and "start" in response.json()["error"]["fields"], response.content[:300]


def test_deleting_an_image_a_reservation_uses_is_a_409_saying_why(sim_host, image, alice, admin_user, api):
    start = timezone.now() + 5 * H
    services.reserve(alice, image, start=start, end=start + H, actor=alice)
    response = api(admin_user).delete(f"/api/v1/images/{image.pk}/")
    assert response.status_code == 409, response.content[:300]
    assert "1 reservations" in response.json()["error"]["message"]
    assert type(image).objects.filter(pk=image.pk).exists()
