"""Usage reports on a hand-made history: hours split at midnight, peak concurrency, refusals by
reason, mean time to ready; stored days equal the live computation; CSV; filters; who may see."""

import csv
import io
from datetime import UTC, date, datetime, timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management import call_command

from provisioning.models import Image
from reservations import rollup, services, usage
from reservations.models import Refusal, Reservation, ReservationHistory, UsageDay, UsagePeak

pytestmark = pytest.mark.django_db
D = date(2026, 3, 10)
D1 = D + timedelta(days=1)
NOW = datetime(2026, 3, 13, 12, 0, tzinfo=UTC)


def at(day, hour, minute=0, second=0):
    return datetime(day.year, day.month, day.day, hour, minute, second, tzinfo=UTC)


def made(user, image, start, end, ready=None, stop=None, created=None, status="ended", block=None):
    r = Reservation.objects.create(
        user=user, image=image, start=start, end=end, status=status, vcpus=1, memory_mib=256, disk_gib=1, block=block
    )
    Reservation.objects.filter(pk=r.pk).update(created=created or start)
    for state, when in (("pending", created or start), ("ready", ready), (status, stop)):
        if when is not None:
            h = ReservationHistory.objects.create(reservation=r, status=state)
            ReservationHistory.objects.filter(pk=h.pk).update(at=when)
    return r


@pytest.fixture
def history(image, alice, bob):
    physics = Group.objects.create(name="physics")
    later = Group.objects.create(name="zeta")
    alice.groups.add(later, physics)  # her first group is physics (lower id)
    # r1 across midnight: ready 22:10 (600 s after its start), held to its end 02:00.
    made(alice, image, at(D, 22), at(D1, 2), ready=at(D, 22, 10), created=at(D, 21, 55))
    # r2 across midnight, ready after 30 s, ended early at 00:30.
    made(bob, image, at(D, 23), at(D1, 1), ready=at(D, 23, 0, 30), stop=at(D1, 0, 30))
    # r3 built ahead (no wait), 10:00-11:00; r5 11:00-12:00 touches it: never two at once.
    made(alice, image, at(D, 10), at(D, 11), ready=at(D, 9, 55), created=at(D, 9))
    made(bob, image, at(D, 11), at(D, 12), ready=at(D, 11))
    # Never ready: no hours, no time to ready.
    made(bob, image, at(D, 14), at(D, 15), status="failed", stop=at(D, 14, 5))
    for reason, n in (("lacks_memory_mib", 3), ("drained", 1)):
        for _ in range(n):
            Refusal.objects.create(at=at(D, 12), user=bob, image=image.name, reason=reason)
    Refusal.objects.create(at=at(D1, 12), user=alice, image=image.name, group="physics", reason="lacks_vcpus")
    return image


def day(report, d):
    return next(row for row in report["days"] if row["day"] == d.isoformat())


def test_hours_are_split_at_midnight_and_counted_from_ready_to_stop(history):
    report = usage.report(D, D1, now=NOW)
    # D: r1 1h50 (6600 s) + r2 3570 s + r3 3600 s + r5 3600 s; D+1: r1 2 h + r2 30 min.
    assert day(report, D)["hours"] == round(17370 / 3600, 3)
    assert day(report, D1)["hours"] == 2.5
    assert day(report, D)["reservations"] == 4 and day(report, D1)["reservations"] == 0
    assert report["totals"]["hours"] == round(26370 / 3600, 3)
    assert report["images"] == [{"image": "debian-12", "hours": round(26370 / 3600, 3)}]
    # alice's r1 + r3 in physics (6600 + 7200 + 3600 s), bob's in no group (3570 + 1800 + 3600 s)
    assert report["groups"] == [
        {"group": "physics", "hours": round(17400 / 3600, 3)},
        {"group": "", "hours": round(8970 / 3600, 3)},
    ]


def test_use_is_counted_from_ready_to_the_first_stop_by_one_rule(history):
    """``with_use_span``: the usage report's and the hours budgets' one reading of a history."""
    spans = usage.with_use_span(Reservation.objects.filter(start__in=[at(D, 23), at(D, 14)]))
    found = sorted(spans.values_list("start", "ready_at", "stop_at"))
    assert found == [(at(D, 14), None, at(D, 14, 5)), (at(D, 23), at(D, 23, 0, 30), at(D1, 0, 30))]


def test_peak_concurrency_counts_overlaps_not_touching_windows(history):
    report = usage.report(D, D1, now=NOW)
    assert day(report, D)["peak"] == 2 and day(report, D1)["peak"] == 2
    assert report["peak"] == {"value": 2, "day": D.isoformat()}
    physics = usage.report(D, D1, group="physics", now=NOW)
    assert day(physics, D)["peak"] == 1  # r3 and r1 never overlap
    assert day(physics, D)["hours"] == round((6600 + 3600) / 3600, 3)


def test_refusals_are_counted_by_reason_and_mean_time_to_ready(history):
    report = usage.report(D, D1, now=NOW)
    assert [(r["reason"], r["count"]) for r in report["refusals"]] == [
        ("lacks_memory_mib", 3),
        ("drained", 1),
        ("lacks_vcpus", 1),
    ]
    assert report["refusals"][0]["label"] == "lack memory"
    assert day(report, D)["refusals"] == 4 and day(report, D1)["refusals"] == 1
    assert report["time_to_ready"] == {"count": 4, "mean_seconds": 157.5}  # (600 + 30 + 0 + 0) / 4
    assert usage.report(D1, D1, now=NOW)["time_to_ready"] == {"count": 0, "mean_seconds": None}


def test_stored_days_equal_the_live_computation(history):
    live = usage.report(D - timedelta(days=1), D1 + timedelta(days=1), now=NOW, stored=False)
    assert rollup.backfill(D - timedelta(days=1), NOW.date(), now=NOW)[-1] == NOW.date() - timedelta(days=1)
    assert UsagePeak.objects.filter(day=D - timedelta(days=1), image=None, group=None).exists()  # empty day marked
    stored = usage.report(D - timedelta(days=1), D1 + timedelta(days=1), now=NOW)
    assert stored == live
    for image, group in ((history.name, None), (None, "physics"), (history.name, "physics"), (None, "")):
        assert usage.report(D, D1, image=image, group=group, now=NOW) == usage.report(
            D, D1, image=image, group=group, now=NOW, stored=False
        )
    # Stored figures are what the report reads: changing them shows (no silent recomputation).
    UsageDay.objects.filter(day=D).update(seconds=3600)
    assert day(usage.report(D, D, now=NOW), D)["hours"] == 2.0  # two (image, group) rows


def test_today_is_computed_live_up_to_now(history):
    now = at(D1, 1)  # r1 still held; r2 still going until its early end at 00:30
    assert rollup.backfill(D, D1, now=now) == [D]  # never today
    assert not UsagePeak.objects.filter(day=D1).exists()
    assert usage.report(D1, D1, now=now)["days"][0]["hours"] == 1.5  # r1 1 h + r2 30 min, so far


def test_the_backfill_command(history):
    call_command("usage_backfill", "--from", D.isoformat(), "--to", D1.isoformat())
    assert set(UsagePeak.objects.values_list("day", flat=True)) == {D, D1}


def test_the_periodic_task_stores_the_last_complete_days(history):
    assert rollup.aggregate_missing(now=at(D1 + timedelta(days=1), 3)) == [D, D1]
    assert UsageDay.objects.filter(day=D).count() == 2


def test_date_range_filters(history):
    only = usage.report(D1, D1, now=NOW)
    assert [d["day"] for d in only["days"]] == [D1.isoformat()]
    assert only["totals"]["hours"] == 2.5
    assert usage.filters({"from": "2026-03-10", "to": "2026-03-11"}, now=NOW)[:2] == (D, D1)
    for bad in ({"from": "yesterday"}, {"from": "2026-03-12", "to": "2026-03-11"}, {"from": "2020-01-01"}):
        with pytest.raises(ValueError):
            usage.filters(bad, now=NOW)


def test_csv_has_the_report(history):
    text = usage.csv_text(usage.report(D, D1, now=NOW))
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["section", "key", "hours", "reservations", "peak", "refusals"]
    assert rows[1] == ["day", "2026-03-10", "4.825", "4", "2", "4"]
    assert rows[2] == ["day", "2026-03-11", "2.5", "0", "2", "1"]
    assert ["image", "debian-12", "7.325", "", "", ""] in rows
    assert ["refusal", "lacks_memory_mib", "", "", "", "3"] in rows
    assert rows[-1] == ["time_to_ready_mean_seconds", "157.5", "", "4", "", ""]


def test_a_real_refusal_is_recorded_with_its_reason(image, sim_host, alice):
    services.reserve(alice, image, actor=alice, duration=timedelta(hours=1), size={"memory_mib": 6000})
    with pytest.raises(ValidationError):
        services.reserve(alice, image, actor=alice, duration=timedelta(hours=1), size={"memory_mib": 6000})
    refusal = Refusal.objects.get()
    assert refusal.reason == "lacks_memory_mib" and refusal.reasons == {"lacks_memory_mib": 1}
    assert refusal.image == image.name and refusal.user == alice
    assert Reservation.objects.count() == 1  # the refused one left nothing behind


def test_non_staff_get_403_on_page_csv_and_api(client, api, alice, history):
    client.force_login(alice)
    assert client.get("/reservations/usage/").status_code == 403
    assert client.get("/reservations/usage.csv").status_code == 403
    assert api(alice).get("/api/v1/usage/").status_code == 403
    assert api(alice).get("/api/v1/usage/csv/").status_code == 403


def test_staff_see_the_page_csv_and_api(client, api, admin_user, history):
    client.force_login(admin_user)
    query = "?from=2026-03-10&to=2026-03-11"
    page = client.get("/reservations/usage/" + query)
    assert page.status_code == 200
    assert 'id="usage-data"' in page.content.decode() and 'id="usage-days"' in page.content.decode()
    assert client.get("/reservations/usage/?from=nope").status_code == 400
    response = client.get("/reservations/usage.csv" + query)
    assert response["Content-Type"] == "text/csv"
    assert "day,2026-03-10,4.825,4,2,4" in response.content.decode()
    body = api(admin_user).get("/api/v1/usage/" + query).json()
    assert body["totals"]["hours"] == 7.325 and body["peak"] == {"value": 2, "day": "2026-03-10"}
    assert api(admin_user).get("/api/v1/usage/?from=2026-13-01").status_code == 400
    assert api(admin_user).get("/api/v1/usage/csv/" + query).content.decode().startswith("section,")


@pytest.mark.parametrize("url", ["/reservations/usage.csv", "/api/v1/usage/csv/"])
def test_the_csv_writes_names_a_spreadsheet_would_run_as_text(client, api, admin_user, history, url):
    link = '=HYPERLINK("http://evil.example/","report")'
    Image.objects.filter(pk=history.pk).update(name=link)
    Group.objects.filter(name="physics").update(name="@SUM(1+1)")
    client.force_login(admin_user)
    get = client.get if url.startswith("/reservations/") else api(admin_user).get
    response = get(url + "?from=2026-03-10&to=2026-03-11")
    assert response.status_code == 200
    rows = list(csv.reader(io.StringIO(response.content.decode(), newline="")))
    assert ["image", "'" + link, "7.325", "", "", ""] in rows
    assert ["group", "'@SUM(1+1)", "4.833", "", "", ""] in rows
    assert not [cell for row in rows for cell in row if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]
