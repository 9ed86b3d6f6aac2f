"""The class calendar, pure: weekly sessions keep their local hour across a DST change,
holidays are skipped, the term's first and last days bound it, overlaps and bad input refused."""

from datetime import UTC, date, datetime, time

import pytest

from classes import calendar
from classes.calendar import Session

BERLIN = "Europe/Berlin"
MON_10 = Session(0, time(10, 0), 90)
THU_14 = Session(3, time(14, 0), 120)


def test_the_local_hour_holds_across_the_spring_change():
    # 2027-03-28 (a Sunday): Berlin goes from UTC+1 to UTC+2.
    found = calendar.occurrences(date(2027, 3, 15), date(2027, 4, 8), [MON_10, THU_14], BERLIN)
    starts = [o.start for o in found]
    assert starts == [
        datetime(2027, 3, 15, 9, 0, tzinfo=UTC),
        datetime(2027, 3, 18, 13, 0, tzinfo=UTC),
        datetime(2027, 3, 22, 9, 0, tzinfo=UTC),
        datetime(2027, 3, 25, 13, 0, tzinfo=UTC),
        datetime(2027, 3, 29, 8, 0, tzinfo=UTC),  # after the change: one hour earlier in UTC
        datetime(2027, 4, 1, 12, 0, tzinfo=UTC),
        datetime(2027, 4, 5, 8, 0, tzinfo=UTC),
        datetime(2027, 4, 8, 12, 0, tzinfo=UTC),
    ]
    assert {o.start.astimezone(calendar.zone_of(BERLIN)).hour for o in found if o.index == 0} == {10}
    assert [(o.end - o.start).total_seconds() / 60 for o in found[:2]] == [90, 120]
    assert found[4].label(BERLIN) == "Mon 2027-03-29 10:00 Europe/Berlin"


def test_a_holiday_is_skipped():
    found = calendar.occurrences(date(2027, 3, 29), date(2027, 4, 11), [MON_10], BERLIN, skip=[date(2027, 3, 29)])
    assert [o.day for o in found] == [date(2027, 4, 5)]


def test_the_first_and_last_day_bound_the_term():
    # Starts on a Tuesday, ends on a Monday: the Monday before is out, the last Monday in.
    found = calendar.occurrences(date(2027, 1, 5), date(2027, 1, 18), [MON_10], "UTC")
    assert [o.day for o in found] == [date(2027, 1, 11), date(2027, 1, 18)]
    assert calendar.occurrences(date(2027, 1, 5), date(2027, 1, 10), [MON_10], "UTC") == []


def test_a_time_skipped_by_the_change_is_taken_before_it():
    at_two_thirty = Session(6, time(2, 30), 60)  # the Sunday of the change: 02:30 does not exist
    [found] = calendar.occurrences(date(2027, 3, 28), date(2027, 3, 28), [at_two_thirty], BERLIN)
    assert found.start == datetime(2027, 3, 28, 1, 30, tzinfo=UTC)


def test_overlapping_sessions_are_named():
    late = Session(0, time(11, 0), 30)
    sunday_night = Session(6, time(23, 30), 60)
    monday_early = Session(0, time(0, 15), 30)
    assert calendar.overlaps([MON_10, late, THU_14]) == [(0, 1)]
    assert calendar.overlaps([sunday_night, monday_early]) == [(0, 1)]
    assert calendar.overlaps([MON_10, THU_14]) == []
    errors = calendar.term_errors(date(2027, 1, 1), date(2027, 2, 1), [MON_10, late])
    assert errors == {"sessions": ["Mon 10:00 (90 min) overlaps Mon 11:00 (30 min)"]}


def test_a_term_that_ends_before_it_starts_is_refused():
    errors = calendar.term_errors(date(2027, 2, 1), date(2027, 1, 1), [MON_10])
    assert errors["last_day"] == ["the last day (2027-01-01) is before the first day (2027-02-01)"]


def test_an_unknown_zone_is_refused_in_words():
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        calendar.occurrences(date(2027, 1, 1), date(2027, 1, 8), [MON_10], "Mars/Olympus")


def test_a_zone_is_one_the_rest_of_the_site_knows_too():
    """One rule (``core.localtime.is_zone``): a file zoneinfo can read that is no IANA zone name
    (``posix/…``, ``right/…``) is refused as it is for a user's own zone."""
    assert calendar.zone_of(BERLIN).key == BERLIN
    for name in ("posix/Europe/Berlin", "right/UTC", "", None):
        with pytest.raises(ValueError, match="unknown time zone"):
            calendar.zone_of(name)


def test_sessions_and_exceptions_are_read_from_lines():
    assert calendar.parse_sessions("Mon 10:00 90\n\nthursday 14:00 120") == [MON_10, THU_14]
    assert calendar.parse_exceptions("2027-04-05 Easter Monday\n2027-05-01") == [
        (date(2027, 4, 5), "Easter Monday"),
        (date(2027, 5, 1), ""),
    ]
    with pytest.raises(ValueError, match="line 2 'Mon ten 90'"):
        calendar.parse_sessions("Tue 09:00 60\nMon ten 90")
    with pytest.raises(ValueError, match="line 1"):
        calendar.parse_exceptions("April 5th")
