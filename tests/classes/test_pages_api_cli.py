"""Classes in the browser, the REST API and the CLI: instructors make, change and delete their
course's classes; students see their next session and seat, and cannot write; another
instructor's course or class is a 404."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django_q.models import Schedule

from classes import services, tasks
from classes.models import Class, Meeting
from reservations.models import Reservation

pytestmark = pytest.mark.django_db


def form_data(image, term, **more):
    session = term["sessions"][0]
    data = {
        "name": "Networks lab",
        "image": image.pk,
        "time_zone": "UTC",
        "first_day": term["first_day"].isoformat(),
        "last_day": term["last_day"].isoformat(),
        "sessions": f"{('Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun')[session.weekday]} 10:00 60",
        "exceptions": "",
        "lead_minutes": 15,
        "gpus": 0,
    }
    return {**data, **more}


def api_body(course, image, term, **more):
    session = term["sessions"][0]
    body = {
        "name": "Networks lab",
        "course": course.pk,
        "image": image.pk,
        "time_zone": "Europe/Berlin",
        "first_day": term["first_day"].isoformat(),
        "last_day": term["last_day"].isoformat(),
        "sessions": [{"weekday": session.weekday, "start": "10:00", "minutes": 60}],
        "exceptions": [{"day": (term["first_day"] + timedelta(days=7)).isoformat(), "reason": "holiday"}],
    }
    return {**body, **more}


# --- the course page --------------------------------------------------------------------------


def test_an_instructor_makes_a_class_on_the_course_page(client, sim_host, image, course, instructor, student, term):
    client.force_login(instructor)
    page = client.post(f"/classes/{course.pk}/", form_data(image, term))
    assert page.status_code == 302
    klass = Class.objects.get()
    assert klass.course == course and klass.meetings.count() == 2
    shown = client.get(f"/classes/{course.pk}/")
    assert b"Networks lab" in shown.content and b"class-form" in shown.content and b"2 reserved" in shown.content


def test_the_page_says_why_a_class_is_refused_and_makes_nothing(client, sim_host, image, course, instructor, term):
    client.force_login(instructor)
    page = client.post(f"/classes/{course.pk}/", form_data(image, term, seats=6, sessions="Mon 10:00 90\nMon 11:00 30"))
    assert page.status_code == 200 and b"overlaps" in page.content
    page = client.post(f"/classes/{course.pk}/", form_data(image, term, seats=6))
    assert page.status_code == 200 and b"seat 5 of 6 does not fit" in page.content
    assert not Class.objects.exists() and not Reservation.objects.exists()


def test_an_instructor_changes_and_deletes_a_class(client, sim_host, image, course, instructor, term):
    klass = services.create_class(actor=instructor, by=instructor, course=course, name="Lab", image=image, **term)
    client.force_login(instructor)
    edit = client.get(f"/classes/{course.pk}/classes/{klass.pk}/")
    assert edit.status_code == 200 and b"10:00 60" in edit.content
    changed = client.post(f"/classes/{course.pk}/classes/{klass.pk}/", form_data(image, term, name="Lab", seats=3))
    assert changed.status_code == 302 and {m.block.seats for m in klass.meetings.all()} == {3}
    assert client.post(f"/classes/{course.pk}/classes/{klass.pk}/delete/").status_code == 302
    assert not Class.objects.exists() and not Reservation.objects.filter(status="pending").exists()


def test_a_student_sees_the_next_session_and_their_seat_but_no_form(
    client, sim_host, image, course, instructor, student, term
):
    services.create_class(actor=instructor, by=instructor, course=course, name="Lab", image=image, **term)
    seat = Reservation.objects.get(user=student, start=Meeting.objects.first().start)
    client.force_login(student)
    page = client.get(f"/classes/{course.pk}/")
    assert page.status_code == 200 and b"Next session" in page.content
    assert f"/reservations/{seat.pk}/".encode() in page.content and b"class-form" not in page.content
    assert client.post(f"/classes/{course.pk}/", form_data(image, term)).status_code == 403
    klass = Class.objects.get()
    assert client.get(f"/classes/{course.pk}/classes/{klass.pk}/").status_code == 404
    assert client.post(f"/classes/{course.pk}/classes/{klass.pk}/delete/").status_code == 404
    assert Class.objects.exists()


def test_another_instructors_course_and_class_are_404(client, sim_host, image, course, instructor, rival, term):
    klass = services.create_class(actor=instructor, by=instructor, course=course, name="Lab", image=image, **term)
    client.force_login(rival)
    assert client.get(f"/classes/{course.pk}/").status_code == 404
    assert client.post(f"/classes/{course.pk}/", form_data(image, term)).status_code == 404
    assert client.post(f"/classes/{course.pk}/classes/{klass.pk}/delete/").status_code == 404
    assert Class.objects.count() == 1


# --- the REST API -------------------------------------------------------------------------------


def test_an_instructor_makes_changes_and_deletes_a_class_through_the_api(
    api, sim_host, image, course, instructor, term
):
    client = api(instructor)
    made = client.post("/api/v1/classes/", api_body(course, image, term), format="json")
    assert made.status_code == 201, made.content
    assert made.data["time_zone"] == "Europe/Berlin" and made.data["exceptions"][0]["reason"] == "holiday"
    assert [s["reserved"] for s in made.data["next_sessions"]] == [True]  # the second week is a holiday
    pk = made.data["id"]
    changed = client.patch(f"/api/v1/classes/{pk}/", {"seats": 2}, format="json")
    assert changed.status_code == 200 and changed.data["seats"] == 2
    assert client.delete(f"/api/v1/classes/{pk}/").status_code == 204 and not Class.objects.exists()


def test_the_api_refuses_bad_input_with_the_field(api, sim_host, image, course, instructor, term):
    body = api_body(course, image, term, time_zone="Moon/Base", last_day=term["first_day"].isoformat())
    body["first_day"] = (term["first_day"] + timedelta(days=1)).isoformat()
    refused = api(instructor).post("/api/v1/classes/", body, format="json")
    assert refused.status_code == 400 and {"time_zone", "last_day"} <= set(refused.data["error"]["fields"])
    assert not Class.objects.exists()


def test_the_api_keeps_students_and_strangers_out(api, sim_host, image, course, instructor, student, rival, term):
    klass = services.create_class(actor=instructor, by=instructor, course=course, name="Lab", image=image, **term)
    as_student = api(student)
    assert [c["id"] for c in as_student.get("/api/v1/classes/").data["results"]] == [klass.pk]
    assert as_student.post("/api/v1/classes/", api_body(course, image, term), format="json").status_code == 403
    assert as_student.patch(f"/api/v1/classes/{klass.pk}/", {"seats": 1}, format="json").status_code == 403
    assert as_student.delete(f"/api/v1/classes/{klass.pk}/").status_code == 403
    as_rival = api(rival)
    assert as_rival.get("/api/v1/classes/").data["results"] == []
    assert as_rival.get(f"/api/v1/classes/{klass.pk}/").status_code == 404
    assert as_rival.delete(f"/api/v1/classes/{klass.pk}/").status_code == 404
    assert as_rival.post("/api/v1/classes/", api_body(course, image, term), format="json").status_code == 404
    assert Class.objects.count() == 1


# --- the CLI and the planner's schedule ----------------------------------------------------------


def test_the_cli_makes_lists_and_deletes_a_class(capsys, sim_host, image, course, instructor, term):
    day = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[term["sessions"][0].weekday]
    call_command(
        "class", "create", "cs101", "Lab", "--image", image.name, "--first", str(term["first_day"]),
        "--last", str(term["last_day"]), "--session", f"{day} 10:00 60", "--zone", "UTC",
    )  # fmt: skip
    klass = Class.objects.get()
    assert "2 sessions reserved" in capsys.readouterr().out
    call_command("class", "list")
    assert "Lab" in capsys.readouterr().out
    with pytest.raises(CommandError, match="seats: between 1 and"):
        call_command("class", "change", str(klass.pk), "--seats", "0")
    call_command("class", "delete", str(klass.pk))
    assert "2 sessions to come canceled" in capsys.readouterr().out and not Class.objects.exists()


def test_the_planner_schedule_is_made_once(db):
    tasks.ensure_schedule()
    tasks.ensure_schedule()
    schedule = Schedule.objects.get(name=tasks.PLAN_SCHEDULE)
    assert schedule.func == "classes.tasks.plan_round" and schedule.minutes == 1
    assert tasks.plan_round() == {"claimed": 0, "refused": 0, "built": 0}


def test_a_member_who_joins_later_takes_a_free_seat(
    client, sim_host, image, course, instructor, term, django_user_model
):
    services.create_class(actor=instructor, by=instructor, course=course, name="Lab", image=image, seats=2, **term)
    dora = django_user_model.objects.create_user("dora")
    course.user_set.add(dora)
    client.force_login(dora)
    page = client.get(f"/classes/{course.pk}/")
    assert b"Take a seat" in page.content
    meeting = Meeting.objects.first()
    taken = client.post(f"/reservations/blocks/{meeting.block_id}/seat/")
    seat = Reservation.objects.get(user=dora)
    assert taken.status_code == 302 and seat.block_id == meeting.block_id
    assert f"/reservations/{seat.pk}/".encode() in client.get(f"/classes/{course.pk}/").content
