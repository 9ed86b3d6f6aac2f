"""Classes with a term, in-process on a simulated host: each session's seats are claimed as a
block, built before it starts and stopped at its end; holidays skipped; a refusal creates
nothing; changes re-plan what is not built; only a course's instructors make its classes."""

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError

from capacity.models import Allocation
from classes import services
from classes.calendar import Session
from classes.models import Class, Meeting
from reservations import idle, schedule
from reservations.models import BlockAllocation, Reservation

pytestmark = pytest.mark.django_db


def make(course, image, term, by, **more):
    return services.create_class(actor=by, by=by, course=course, name="Networks lab", image=image, **term, **more)


def at(day, hour, minute=0):
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)


def seats_of(meeting):
    return Reservation.objects.filter(block=meeting.block).order_by("pk")


def live_claims():
    return Allocation.objects.filter(released__isnull=True).count()


def test_seats_are_built_before_each_session_and_stopped_after(
    sim_host, image, course, instructor, student, term, sync_jobs
):
    klass = make(course, image, term, instructor)
    first, second = Meeting.objects.filter(klass=klass)
    assert (first.start, first.end) == (at(term["first_day"], 10), at(term["first_day"], 11))
    assert second.start == first.start + timedelta(weeks=1)
    seats = seats_of(first)
    assert [s.user for s in seats] == [instructor, student] and set(s.status for s in seats) == {"pending"}
    assert first.block.group == course and first.block.seats == 2

    assert services.plan_round(first.start - timedelta(minutes=20))["built"] == 0  # lead time: 15 minutes
    assert services.plan_round(first.start - timedelta(minutes=14))["built"] == 2
    sync_jobs.drain()
    assert set(seats_of(first).values_list("status", flat=True)) == {"ready"}
    assert set(seats_of(second).values_list("status", flat=True)) == {"pending"}  # next week's waits
    meeting, seat = services.next_seat(student, klass, now=first.start)
    assert meeting == first and seat.user == student and seat.status == "ready"

    schedule.tick(now=first.end + timedelta(minutes=1))
    sync_jobs.drain()
    assert set(seats_of(first).values_list("status", flat=True)) == {"ended"}
    assert all(s.vm.state == "destroyed" for s in seats_of(first))
    assert services.next_seat(student, klass, now=first.end)[0] == second


def test_a_holiday_is_skipped(sim_host, image, course, instructor, term):
    holiday = term["first_day"] + timedelta(days=7)
    klass = make(course, image, term, instructor, exceptions=[(holiday, "Founders' Day")])
    assert [m.start for m in Meeting.objects.filter(klass=klass)] == [at(term["first_day"], 10)]
    assert [o.day for o in services.occurrences(klass)] == [term["first_day"]]


def test_not_enough_capacity_creates_nothing(sim_host, image, course, instructor, term):
    # 8 GiB on the host, 2 GiB a seat: the fifth seat of the first session does not fit.
    with pytest.raises(ValidationError) as refused:
        make(course, image, term, instructor, seats=6)
    [message] = refused.value.message_dict["sessions"]
    day = term["first_day"]
    assert message.startswith(f"the session of {day:%a} {day.isoformat()} 10:00 UTC: seat 5 of 6 does not fit")
    assert not Class.objects.exists() and not BlockAllocation.objects.exists() and not Reservation.objects.exists()
    assert live_claims() == 0


def test_later_sessions_are_claimed_as_they_come_into_the_look_ahead(
    sim_host, image, course, instructor, term, settings
):
    settings.CLASS_LOOKAHEAD_DAYS = 5
    term["last_day"] = term["first_day"] + timedelta(days=20)
    klass = make(course, image, term, instructor)
    assert Meeting.objects.filter(klass=klass).count() == 1
    later = at(term["first_day"], 9) + timedelta(days=3)
    assert services.plan_round(later)["claimed"] == 1
    assert services.plan_round(later) == {"claimed": 0, "refused": 0, "built": 0}  # idempotent
    assert Meeting.objects.filter(klass=klass).count() == 2 and BlockAllocation.objects.count() == 2


def test_a_session_that_does_not_fit_later_is_noted_and_tried_again(
    sim_host, image, course, instructor, term, settings
):
    settings.CLASS_LOOKAHEAD_DAYS = 5
    klass = make(course, image, term, instructor, seats=4)
    second = at(term["first_day"], 10) + timedelta(weeks=1)
    other = services.create_class(
        actor="test",
        course=Group.objects.create(name="cs102"),
        name="blocker",
        image=image,
        first_day=term["first_day"] + timedelta(days=7),
        last_day=term["first_day"] + timedelta(days=7),
        sessions=term["sessions"],
        time_zone="UTC",
        seats=4,
        now=second - timedelta(days=4),
    )
    assert services.plan_round(second - timedelta(days=3))["refused"] == 1
    klass.refresh_from_db()
    assert "seat 1 of 4 does not fit" in klass.problem and Meeting.objects.filter(klass=klass).count() == 1
    services.delete_class(other, actor="test", now=second - timedelta(days=3))
    assert services.plan_round(second - timedelta(days=2))["claimed"] == 1
    klass.refresh_from_db()
    assert klass.problem == "" and Meeting.objects.filter(klass=klass).count() == 2


def test_changing_a_class_re_plans_its_future_sessions(sim_host, image, course, instructor, term):
    klass = make(course, image, term, instructor)
    old_blocks = list(BlockAllocation.objects.values_list("pk", flat=True))
    later = [Session(term["first_day"].weekday(), time(14, 0), 90)]
    services.change_class(klass, actor=instructor, by=instructor, sessions=later)
    assert [m.start.hour for m in Meeting.objects.filter(klass=klass)] == [14, 14]
    assert not BlockAllocation.objects.filter(pk__in=old_blocks, canceled=False).exists()
    assert set(Reservation.objects.filter(block__in=old_blocks).values_list("status", flat=True)) == {"canceled"}
    assert live_claims() == 2 * 1  # one seat (the instructor) for each of the two new sessions


def test_a_change_that_does_not_fit_keeps_the_old_plan(sim_host, image, course, instructor, term):
    klass = make(course, image, term, instructor, seats=2)
    with pytest.raises(ValidationError, match="seat 5 of 6 does not fit"):
        services.change_class(klass, actor=instructor, by=instructor, seats=6)
    klass.refresh_from_db()
    assert klass.seats == 2 and Meeting.objects.filter(klass=klass).count() == 2 and live_claims() == 4


def test_deleting_a_class_cancels_its_sessions_and_releases_their_claims(sim_host, image, course, instructor, term):
    klass = make(course, image, term, instructor)
    assert live_claims() == 2
    assert services.delete_class(klass, actor=instructor) == 2
    assert not Class.objects.exists() and live_claims() == 0
    assert set(Reservation.objects.values_list("status", flat=True)) == {"canceled"}


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"last_day": "first"}, "last_day", "is before the first day"),
        ({"time_zone": "Europe/Atlantis"}, "time_zone", "unknown time zone"),
        ({"sessions": "overlapping"}, "sessions", "overlaps"),
        ({"seats": 5000}, "seats", "between 1 and"),
    ],
)
def test_bad_input_is_refused_and_creates_nothing(sim_host, image, course, instructor, term, change, field, words):
    if change.get("last_day") == "first":
        change = {"last_day": term["first_day"] - timedelta(days=1)}
    if change.get("sessions") == "overlapping":
        weekday = term["first_day"].weekday()
        change = {"sessions": [Session(weekday, time(10, 0), 60), Session(weekday, time(10, 30), 60)]}
    with pytest.raises(ValidationError) as refused:
        make(
            course,
            image,
            {**term, **{k: v for k, v in change.items() if k in term}},
            instructor,
            **{k: v for k, v in change.items() if k not in term},
        )
    assert any(words in m for m in refused.value.message_dict[field])
    assert not Class.objects.exists() and not Reservation.objects.exists()


def test_a_student_cannot_make_a_class(sim_host, image, course, student, term):
    with pytest.raises(PermissionDenied):
        make(course, image, term, student)
    assert not Class.objects.exists()


def test_an_instructor_cannot_make_a_class_for_another_course(sim_host, image, course, instructor, term):
    other = Group.objects.create(name="ee201")
    with pytest.raises(PermissionDenied):
        make(other, image, term, instructor)
    assert services.managed_classes(instructor).count() == 0


def test_sessions_keep_their_local_hour_across_the_change_to_summer_time(sim_host, image, course, instructor):
    sessions = [Session(0, time(10, 0), 60), Session(3, time(14, 0), 60)]  # Mondays 10:00, Thursdays 14:00
    klass = services.create_class(
        actor=instructor,
        by=instructor,
        course=course,
        name="Berlin lab",
        image=image,
        time_zone="Europe/Berlin",
        first_day=datetime(2027, 3, 22).date(),
        last_day=datetime(2027, 4, 2).date(),
        sessions=sessions,
        now=datetime(2027, 3, 20, tzinfo=UTC),
    )
    hours = [m.start.hour for m in Meeting.objects.filter(klass=klass)]
    assert hours == [9, 13, 8, 12]  # UTC: one hour earlier after 2027-03-28, 10:00 and 14:00 in Berlin


def test_a_berlin_term_across_the_change_to_summer_time_builds_and_stops_each_session_at_its_local_hour(
    sim_host, image, course, instructor, student, sync_jobs
):
    berlin = ZoneInfo("Europe/Berlin")
    sessions = [Session(0, time(9, 0), 60), Session(3, time(14, 0), 90)]  # Mondays 09:00, Thursdays 14:00
    holiday = date(2027, 3, 25)  # the Thursday before the change
    klass = services.create_class(
        actor=instructor,
        by=instructor,
        course=course,
        name="Berlin lab",
        image=image,
        time_zone="Europe/Berlin",
        first_day=date(2027, 3, 22),
        last_day=date(2027, 4, 2),
        sessions=sessions,
        exceptions=[(holiday, "Staff day")],
        now=datetime(2027, 3, 20, tzinfo=UTC),
    )
    meetings = list(Meeting.objects.filter(klass=klass).order_by("start"))
    assert [m.start.astimezone(berlin).date() for m in meetings] == [
        date(2027, 3, 22),
        date(2027, 3, 29),
        date(2027, 4, 1),
    ]
    assert holiday not in [o.day for o in services.occurrences(klass)]  # no session, no meeting, no seats
    before, after = meetings[0], meetings[1]  # 2027-03-28 lies between them
    assert (before.start.hour, after.start.hour) == (8, 7)  # UTC: CET, then CEST

    for meeting in (before, after):
        local = meeting.start.astimezone(berlin)
        assert (local.hour, local.minute) == (9, 0) and meeting.end - meeting.start == timedelta(hours=1)
        assert services.plan_round(meeting.start - timedelta(minutes=20))["built"] == 0  # lead time: 15 minutes
        assert services.plan_round(meeting.start - timedelta(minutes=14))["built"] == 2
        sync_jobs.drain()
        assert set(seats_of(meeting).values_list("status", flat=True)) == {"ready"}
        found, seat = services.next_seat(student, klass, now=meeting.start)
        assert found == meeting and seat.status == "ready"  # ready by the session's start

        schedule.tick(now=meeting.end + timedelta(minutes=1))
        sync_jobs.drain()
        assert set(seats_of(meeting).values_list("status", flat=True)) == {"ended"}
        assert all(s.vm.state == "destroyed" for s in seats_of(meeting))
    assert set(seats_of(meetings[2]).values_list("status", flat=True)) == {"pending"}  # Thursday's waits


def test_a_term_far_away_is_refused(sim_host, image, course, instructor, term):
    far = term["first_day"].replace(year=term["first_day"].year + 5)
    with pytest.raises(ValidationError, match="within three years"):
        make(course, image, {**term, "last_day": far}, instructor)
    assert not Class.objects.exists()


def test_idle_reclamation_runs_inside_the_session_under_the_courses_policy(
    sim_host, image, course, instructor, student, term, sync_jobs
):
    idle.set_policy(actor="test", group=course, no_show_minutes=5, idle_minutes=30, warn_minutes=5)
    klass = make(course, image, term, instructor)
    first = Meeting.objects.filter(klass=klass).first()
    services.plan_round(first.start - timedelta(minutes=15))
    sync_jobs.drain()
    seat = Reservation.objects.get(block=first.block, user=student)
    assert seat.status == "ready"
    # Built a quarter of an hour ahead: the no-show clock starts with the session, not at ready.
    assert (seat.idle_since, seat.idle_kind) == (first.start, "no_show")
    assert seat.idle_deadline == first.start + timedelta(minutes=5)


def test_a_new_name_keeps_the_claims(sim_host, image, course, instructor, student, term):
    klass = make(course, image, term, instructor)
    seats = set(Reservation.objects.values_list("pk", flat=True))
    services.change_class(klass, actor=instructor, by=instructor, name="Networks lab II", lead_minutes=30)
    assert set(Reservation.objects.filter(status="pending").values_list("pk", flat=True)) == seats
    klass.refresh_from_db()
    assert (klass.name, klass.lead_minutes) == ("Networks lab II", 30)
