"""Weekly occurrences keep the local wall-clock hour across a change of daylight saving time."""

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from core import localtime

BERLIN = ZoneInfo("Europe/Berlin")


def test_a_weekly_class_keeps_its_local_hour_across_the_spring_change():
    # Europe goes from CET (+01:00) to CEST (+02:00) on 2027-03-28.
    first = datetime(2027, 3, 22, 14, 0)  # a Monday, 14:00 local
    weeks = localtime.weekly(first, BERLIN, 3)
    assert [w.strftime("%Y-%m-%d %H:%M %Z") for w in weeks] == [
        "2027-03-22 14:00 CET",
        "2027-03-29 14:00 CEST",
        "2027-04-05 14:00 CEST",
    ]
    assert [w.astimezone(UTC).hour for w in weeks] == [13, 12, 12]


def test_an_aware_start_is_read_in_the_zone_given():
    first = datetime(2027, 11, 1, 13, 0, tzinfo=UTC)  # 14:00 CET, the day after the autumn change
    back = localtime.nth_week(first, BERLIN, -1)
    assert back.strftime("%H:%M %Z") == "14:00 CEST"
    assert back.astimezone(UTC).hour == 12


def test_a_time_in_the_skipped_hour_becomes_the_hour_after():
    moved = localtime.nth_week(datetime(2027, 3, 21, 2, 30), BERLIN, 1)
    assert moved.strftime("%Y-%m-%d %H:%M %Z") == "2027-03-28 03:30 CEST"


def test_zone_names_are_checked():
    assert localtime.is_zone("Europe/Berlin") and localtime.is_zone("UTC")
    assert not localtime.is_zone("Mars/Olympus") and not localtime.is_zone("../etc/passwd")
    assert localtime.zone("Mars/Olympus", "Europe/Berlin") == BERLIN
    assert localtime.abbreviation(datetime(2027, 1, 1, tzinfo=UTC), BERLIN) == "CET"
