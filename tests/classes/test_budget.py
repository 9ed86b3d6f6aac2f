"""A class's hours budget outside its sessions, in-process on a simulated host: a request counts
its whole duration, a reservation its hours from ready, the rest of one ended early comes back;
a request past the budget is refused with the hours left; extra hours raise it; parallel
requests never pass it; only the course's instructors see everyone's and grant."""

import threading
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from classes import budget, services
from classes.calendar import Session
from classes.models import BudgetGrant, Class
from core.models import ObjectChange
from reservations import services as reservations
from reservations.models import Reservation, ReservationHistory

pytestmark = pytest.mark.django_db
H = timedelta(hours=1)


def make(course, image, instructor, hours_budget=Decimal(3), name="Networks lab", **more):
    """A class whose term holds today (its sessions three and ten days from now, 10:00 UTC)."""
    today = timezone.now().date()
    term = {
        "first_day": today - timedelta(days=1),
        "last_day": today + timedelta(days=13),
        "sessions": [Session((today + timedelta(days=3)).weekday(), time(10, 0), 60)],
        "time_zone": "UTC",
    }
    term.update(more)
    return services.create_class(
        actor=instructor, by=instructor, course=course, name=name, image=image, hours_budget=hours_budget, **term
    )


def later(hours=1):
    return (timezone.now() + hours * H).replace(microsecond=0)


def reserve(user, image, start, duration):
    return reservations.reserve(user, image, actor=user, start=start, duration=duration)


def refusal(exc):
    return " ".join(exc.value.message_dict["end"])


# --- counting ------------------------------------------------------------------------------------


def test_a_request_counts_its_whole_duration_and_one_past_the_budget_is_refused_with_the_hours_left(
    sim_host, image, course, instructor, student
):
    klass = make(course, image, instructor)
    reserve(student, image, later(1), 2 * H)
    assert budget.standing(student, klass).used == Decimal("2.00")
    with pytest.raises(ValidationError) as refused:
        reserve(student, image, later(4), 1.5 * H)
    assert refusal(refused) == ("1 hour left of your 3-hour budget for Networks lab; this asks for 1.5 hours")
    # The reserve form's live check says the same before anything is sent.
    errors = reservations.validate(student, image, later(4), later(4) + 1.5 * H)
    assert "1 hour left of your 3-hour budget" in errors["end"][0]
    reserve(student, image, later(4), H)  # exactly what is left
    assert budget.standing(student, klass).left == 0
    assert Reservation.objects.filter(user=student, block__isnull=True).count() == 2


def test_hours_count_from_ready_and_the_rest_of_one_ended_early_comes_back(
    sim_host, image, course, instructor, student, sync_jobs
):
    klass = make(course, image, instructor)
    mine = reserve(student, image, None, 2 * H)
    sync_jobs.drain()
    mine.refresh_from_db()
    assert mine.status == "ready"
    # Say it was booked an hour ago and its machine was ready half an hour after its start:
    # it counts from ready to its booked end while it runs.
    now = timezone.now()
    Reservation.objects.filter(pk=mine.pk).update(start=now - H, end=now + H)
    ReservationHistory.objects.filter(reservation=mine, status="ready").update(at=now - 0.5 * H)
    assert budget.standing(student, klass).used == Decimal("1.50")

    reservations.end(Reservation.objects.get(pk=mine.pk), actor=student)
    sync_jobs.drain()
    assert Reservation.objects.get(pk=mine.pk).status == "ended"
    standing = budget.standing(student, klass)
    assert Decimal("0.49") <= standing.used <= Decimal("0.51")  # ready to the end asked for
    assert Decimal("2.49") <= standing.left <= Decimal("2.51")
    reserve(student, image, later(3), 2 * H)  # the hour and a half not used came back


def test_a_reservation_never_ready_counts_nothing_and_session_seats_count_nothing(
    sim_host, image, course, instructor, student
):
    klass = make(course, image, instructor)
    assert Reservation.objects.filter(user=student, block__isnull=False).exists()  # the sessions' seats
    canceled = reserve(student, image, later(2), 3 * H)
    reservations.cancel(canceled, actor=student)
    assert budget.standing(student, klass).used == 0
    reserve(student, image, later(2), 3 * H)


def test_extra_hours_raise_the_budget_and_are_recorded(sim_host, image, course, instructor, student):
    klass = make(course, image, instructor, hours_budget=Decimal(0))
    with pytest.raises(ValidationError) as refused:
        reserve(student, image, later(1), H)
    assert refusal(refused).startswith("0 hours left of your 0-hour budget for Networks lab")
    grant = budget.grant_hours(klass, student, "1.5", "missed the lab: sick", actor=instructor, by=instructor)
    assert (grant.hours, grant.granted_by, grant.reason) == (Decimal("1.50"), instructor, "missed the lab: sick")
    assert ObjectChange.objects.filter(object_id=str(grant.pk), reason="missed the lab: sick").exists()
    reserve(student, image, later(1), 1.5 * H)
    with pytest.raises(ValidationError, match="has 1.5 extra hours"):
        budget.grant_hours(klass, student, -2, "too much", actor=instructor, by=instructor)
    with pytest.raises(ValidationError) as bad:
        budget.grant_hours(klass, student, 0, "", actor=instructor, by=instructor)
    assert {"hours"} == set(bad.value.message_dict)
    assert BudgetGrant.objects.count() == 1


def test_an_extension_past_the_budget_is_refused(sim_host, image, course, instructor, student):
    make(course, image, instructor)
    mine = reserve(student, image, later(1), 2 * H)
    with pytest.raises(ValidationError) as refused:
        reservations.extend(mine, mine.end + 2 * H, actor=student)
    assert "1 hour left of your 3-hour budget" in refusal(refused)
    assert "this asks for 2 hours" in refusal(refused)
    reservations.extend(mine, mine.end + H, actor=student)


def test_a_seat_extended_past_its_session_counts_the_hours_after_it(sim_host, image, course, instructor, student):
    klass = make(course, image, instructor, hours_budget=Decimal(1))
    seat = Reservation.objects.filter(user=student, block__isnull=False).order_by("start").first()
    with pytest.raises(ValidationError, match="this asks for 2 hours"):
        reservations.extend(seat, seat.end + 2 * H, actor=student)
    reservations.extend(seat, seat.end + H, actor=student)
    assert budget.standing(student, klass).used == 1


def test_blank_is_no_limit_and_instructors_and_other_images_are_not_counted(
    sim_host, image, course, instructor, student
):
    klass = make(course, image, instructor, hours_budget=None)
    reserve(student, image, later(1), 4 * H)
    assert budget.standing(student, klass).note() == "4 hours used for Networks lab (no limit)"
    services.change_class(klass, actor=instructor, by=instructor, hours_budget=Decimal(1))
    with pytest.raises(ValidationError, match="0 hours left of your 1-hour budget"):
        reserve(student, image, later(6), H)
    reserve(instructor, image, later(6), 5 * H)  # its instructor is no student of it
    klass.refresh_from_db()
    assert klass.meetings.count() == 2  # a new budget re-plans no session


def test_a_reservation_outside_the_term_is_not_counted(sim_host, image, course, instructor, student):
    day = timezone.now().date() + timedelta(days=3)
    make(course, image, instructor, first_day=day, last_day=day + timedelta(days=7))
    reserve(student, image, later(1), 4 * H)  # before the term: no budget binds
    inside = datetime.combine(day + timedelta(days=1), time(12, 0), tzinfo=UTC)
    with pytest.raises(ValidationError, match="3 hours left of your 3-hour budget for Networks lab"):
        reserve(student, image, inside, 4 * H)
    reserve(student, image, inside, 3 * H)


def test_of_two_classes_of_one_image_the_term_that_started_last_binds(sim_host, image, course, instructor, student):
    first = make(course, image, instructor, hours_budget=Decimal(1), name="Lab A")
    today = timezone.now().date()
    second = make(
        course, image, instructor, hours_budget=Decimal(4), name="Lab B", first_day=today, seats=1,
        sessions=[Session((today + timedelta(days=4)).weekday(), time(14, 0), 60)],
    )  # fmt: skip
    reserve(student, image, later(1), 3 * H)
    assert budget.standing(student, second).used == Decimal(3) and budget.standing(student, first).used == 0
    with pytest.raises(ValidationError, match="1 hour left of your 4-hour budget for Lab B"):
        reserve(student, image, later(5), 2 * H)


def test_the_budget_check_reads_a_fixed_number_of_statements_however_many_classes(
    sim_host, image, course, instructor, student
):
    """It runs in every reservation's locked transaction: other classes of the image (in other
    courses of the student's, or terms far off) cost no statement each."""
    klass = make(course, image, instructor)
    reserve(student, image, later(1), H)
    today = timezone.now().date()

    def statements():
        with CaptureQueriesContext(connection) as done:
            assert budget.used_seconds(klass, [student.pk])[student.pk] == 3600
        return len(done)

    def another(n, first_day):
        group = Group.objects.create(name=f"course-{n}")
        group.user_set.add(student)
        Class.objects.create(
            course=group, name=f"c{n}", image=image, time_zone="UTC", first_day=first_day,
            last_day=first_day + timedelta(days=20), hours_budget=1,
        )  # fmt: skip

    another(0, today - timedelta(days=30))
    few = statements()
    for n in range(1, 7):
        another(n, today - timedelta(days=30) if n % 2 else today + timedelta(days=300))
    assert statements() == few <= 8


# --- parallel requests ---------------------------------------------------------------------------


@pytest.mark.file_db
def test_parallel_requests_never_pass_the_budget(transactional_db, make_host, image, course, instructor, student):
    make_host("sim-big", cpus=64, memory_mib=262144, disk_gib=4000)
    klass = make(course, image, instructor, hours_budget=Decimal(5))
    outcomes, gate = [], threading.Barrier(4)

    def run(n):
        gate.wait()
        try:
            reserve(student, image, later(1 + 3 * n), 2 * H)  # apart: no quota of the site binds
            outcomes.append("ok")
        except ValidationError as exc:
            outcomes.append(" ".join(exc.messages))
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == 4 and outcomes.count("ok") == 2, outcomes
    assert all("1 hour left of your 5-hour budget" in o for o in outcomes if o != "ok"), outcomes
    assert budget.standing(student, klass).used == Decimal(4)


# --- who sees and grants ---------------------------------------------------------------------------


def test_the_course_page_shows_a_student_their_hours_and_the_instructor_everyones(
    client, sim_host, image, course, instructor, student
):
    klass = make(course, image, instructor)
    reserve(student, image, later(1), 2 * H)
    client.force_login(student)
    page = client.get(f"/classes/{course.pk}/").content.decode()
    assert "1 hour left of your 3-hour budget for Networks lab" in page and f"grant-form-{klass.pk}" not in page
    assert client.post(f"/classes/{course.pk}/classes/{klass.pk}/grants/", {}).status_code == 404

    client.force_login(instructor)
    page = client.get(f"/classes/{course.pk}/").content.decode()
    assert f'data-student="{student.username}"' in page and f"grant-form-{klass.pk}" in page
    granted = client.post(
        f"/classes/{course.pk}/classes/{klass.pk}/grants/",
        {"student": student.username, "hours": "2", "reason": "project week"},
    )
    assert granted.status_code == 302 and budget.standing(student, klass).left == 3
    refused = client.post(
        f"/classes/{course.pk}/classes/{klass.pk}/grants/",
        {"student": instructor.username, "hours": "2", "reason": "x"},
    )
    assert refused.status_code == 302 and BudgetGrant.objects.count() == 1  # an instructor is no student


def test_the_reserve_forms_check_says_the_hours_left(client, sim_host, image, course, instructor, student):
    make(course, image, instructor)
    client.force_login(student)
    answer = client.get("/reservations/new/fit/", {"image": image.pk, "when": "now", "duration": 60})
    assert b"3 hours left of your 3-hour budget for Networks lab" in answer.content, answer.content


def test_the_api_shows_budgets_and_only_instructors_grant(api, sim_host, image, course, instructor, student, rival):
    klass = make(course, image, instructor)
    reserve(student, image, later(1), 2 * H)
    url = f"/api/v1/classes/{klass.pk}/"
    assert api(student).get(url).data["hours_budget"] == "3.00"
    mine = api(student).get(f"{url}budget/")
    assert mine.status_code == 200 and [(r["student"], r["used"], r["left"]) for r in mine.data] == [
        (student.username, "2.00", "1.00")
    ]
    everyone = api(instructor).get(f"{url}budget/")
    assert [r["student"] for r in everyone.data] == [student.username]
    body = {"student": student.username, "hours": "1.5", "reason": "project week"}
    assert api(student).post(f"{url}grants/", body, format="json").status_code == 403
    assert api(rival).get(f"{url}budget/").status_code == 404
    assert api(rival).post(f"{url}grants/", body, format="json").status_code == 404
    made = api(instructor).post(f"{url}grants/", body, format="json")
    assert made.status_code == 201 and made.data["hours"] == "1.50" and made.data["granted_by"] == instructor.username
    bad = api(instructor).post(f"{url}grants/", {**body, "student": "nobody"}, format="json")
    assert bad.status_code == 400 and "student" in bad.data["error"]["fields"]
    assert api(student).get(f"{url}budget/").data[0]["left"] == "2.50"
    with pytest.raises(PermissionDenied):
        budget.grant_hours(klass, student, 1, "mine", actor=rival, by=rival)


def test_the_cli_grants_and_shows_the_budget(capsys, sim_host, image, course, instructor, student):
    klass = make(course, image, instructor)
    call_command("class", "grant", str(klass.pk), student.username, "2.5", "--reason", "lab rerun")
    assert "granted 2.5 hours to bob: 5.5 hours left of your 5.5-hour budget" in capsys.readouterr().out
    call_command("class", "budget", str(klass.pk))
    assert "bob\t0 h used\t2.5 h extra\t5.5 left" in capsys.readouterr().out
    with pytest.raises(CommandError, match="reason: say why"):
        call_command("class", "grant", str(klass.pk), student.username, "1", "--reason", " ")
    with pytest.raises(CommandError, match="not a number of hours"):
        call_command("class", "grant", str(klass.pk), student.username, "lots", "--reason", "x")


def test_a_weekly_seat_across_daylight_saving_counts_only_past_its_own_session(
    sim_host, image, course, instructor, student
):
    """A block's weeks are at the local hour: after the spring change a week's session ends an
    hour earlier in UTC than a week after the first's, and only what runs past it counts."""
    then = datetime(2027, 3, 1, tzinfo=UTC)
    klass = make(
        course,
        image,
        instructor,
        first_day=date(2027, 3, 1),
        last_day=date(2027, 3, 31),
        sessions=[Session(6, time(3), 30)],
    )
    start = datetime(2027, 3, 8, 15, tzinfo=UTC)  # 10:00 in New York (EST); a week later EDT
    block = reservations.create_block(
        actor=instructor, name="lab", image=image, group=course, seats=2, start=start, end=start + H, weeks=2,
        created_by=instructor, now=then, time_zone=ZoneInfo("America/New_York"),
    )  # fmt: skip
    seat = Reservation.objects.get(block=block, user=student, occurrence=1)
    assert seat.start == datetime(2027, 3, 15, 14, tzinfo=UTC)
    Reservation.objects.filter(pk=seat.pk).update(end=seat.end + H)  # kept an hour past its session
    assert budget.standing(student, klass).used == 1
