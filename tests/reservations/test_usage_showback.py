"""Showback on a hand-made history of every kind of use: a reservation, a class session's seat,
a batch run and an ad-hoc VM, split at midnight into hours, vCPU-, GiB- and GPU-hours per user,
class, group and image; stored days equal the live computation; cost from prices; who sees
what (administrator, auditor, instructor, student); the CSV; the API's grouping and filters."""

import csv
import io
from datetime import date, datetime, timedelta

import pytest
from django.contrib.auth.models import Group

from accounts import access
from capacity.models import Allocation
from classes import budget
from classes.models import Class, Meeting
from provisioning.models import VM
from reservations import rollup, showback
from reservations.models import BlockAllocation, Reservation, UsageRollup
from runs.models import Run
from tests.reservations.test_usage import at, made

pytestmark = pytest.mark.django_db
D = date(2026, 3, 10)
D1, D2 = D + timedelta(days=1), D + timedelta(days=2)
NOW = datetime(2026, 3, 13, 12, 0, tzinfo=at(D, 0).tzinfo)
EVERYONE = showback.Scope(everything=True)
PRICES = {"hour": 0.1, "vcpu_hour": 0.01, "gib_hour": 0.005, "gpu_hour": 0.5}


def sized(reservation, vcpus, memory_mib, gpus=0):
    Reservation.objects.filter(pk=reservation.pk).update(vcpus=vcpus, memory_mib=memory_mib, gpus=gpus)


@pytest.fixture
def history(image, alice, bob, django_user_model, sim_host):
    """alice teaches cs101 (a class "Intro", a budget of 40 hours); bob is its student; carol is in no course."""
    course = Group.objects.create(name="cs101")
    course.user_set.add(alice, bob)
    access.set_roles(alice, ["instructor"], actor=alice)
    carol = django_user_model.objects.create_user("carol")
    # alice's own reservation across midnight, 2 vCPUs, 2 GiB, 1 GPU: 2 h on D and 2 h on D+1.
    sized(made(alice, image, at(D, 22), at(D1, 2), ready=at(D, 22)), 2, 2048, 1)
    # bob's seat in a session of Intro on D 10:00-11:00 (ready at its start), 1 vCPU, 1 GiB.
    intro = Class.objects.create(
        name="Intro",
        course=course,
        image=image,
        time_zone="UTC",
        first_day=D,
        last_day=D + timedelta(days=30),
        hours_budget=40,
    )
    block = BlockAllocation.objects.create(
        name="Intro week", image=image, group=course, seats=1, start=at(D, 10), end=at(D, 11)
    )
    Meeting.objects.create(klass=intro, start=at(D, 10), end=at(D, 11), block=block)
    sized(made(bob, image, at(D, 10), at(D, 11), ready=at(D, 10), block=block), 1, 1024)
    # bob's batch run: command from D+1 23:00 to D+2 01:00, 30 min of it suspended: 1 h + 30 min.
    Run.objects.create(
        owner=bob,
        image=image,
        vcpus=4,
        memory_mib=4096,
        disk_gib=10,
        time_limit=7200,
        hold_until=at(D2, 3),
        state="success",
        started=at(D1, 23),
        ended=at(D2, 1),
        suspended_seconds=1800,
    )
    # carol's ad-hoc VM: its claim from D 12:00 to its release at 18:00, 8 vCPUs, 8 GiB, 2 GPUs.
    claim = Allocation.objects.create(
        host=sim_host,
        owner=carol,
        purpose="vm",
        vcpus=8,
        memory_mib=8192,
        disk_gib=10,
        extras={"gpu:nvidia-t4": 2},
        start=at(D, 12),
        end=at(D, 20),
        released=at(D, 18),
    )
    vm = VM.objects.create(
        image=image, owner=carol, vcpus=8, memory_mib=8192, disk_gib=10, state="destroyed", allocation=claim
    )
    VM.objects.filter(pk=vm.pk).update(created=at(D, 11, 59))
    # A VM that failed to build holds nothing; a run's or reservation's VM is theirs (adhoc=False).
    VM.objects.create(image=image, owner=carol, vcpus=2, memory_mib=512, disk_gib=1, state="failed")
    VM.objects.create(image=image, owner=bob, vcpus=2, memory_mib=512, disk_gib=1, state="running", adhoc=False)
    return {"alice": alice, "bob": bob, "carol": carol, "intro": intro, "course": course}


def by_label(report):
    return {row["label"]: row for row in report["rows"]}


def figures(row):
    return (row["hours"], row["vcpu_hours"], row["gib_hours"], row["gpu_hours"], row["uses"])


def test_each_kind_is_counted_per_user_with_its_size(history):
    rows = by_label(showback.report(D, D2, by="user", scope=EVERYONE, now=NOW))
    assert figures(rows["alice"]) == (4.0, 8.0, 8.0, 4.0, 1)  # the reservation
    assert figures(rows["bob"]) == (2.5, 7.0, 7.0, 0.0, 2)  # the seat 1 h×1, the run 1.5 h×4
    assert figures(rows["carol"]) == (6.0, 48.0, 48.0, 12.0, 1)  # the ad-hoc VM
    kinds = {k["kind"]: figures(k) for k in showback.report(D, D2, by="user", scope=EVERYONE, now=NOW)["kinds"]}
    assert kinds == {
        "reservation": (4.0, 8.0, 8.0, 4.0, 1),
        "class": (1.0, 1.0, 1.0, 0.0, 1),
        "run": (1.5, 6.0, 6.0, 0.0, 1),
        "vm": (6.0, 48.0, 48.0, 12.0, 1),
    }


def test_uses_are_split_at_midnight(history):
    def hours(day):
        return {r["label"]: r["hours"] for r in showback.report(day, day, by="user", scope=EVERYONE, now=NOW)["rows"]}

    assert hours(D) == {"carol": 6.0, "alice": 2.0, "bob": 1.0}
    assert hours(D1) == {"alice": 2.0, "bob": 1.0}  # the run's first hour
    assert hours(D2) == {"bob": 0.5}  # its end, less the 30 min it was suspended
    uses = showback.report(D1, D1, by="user", scope=EVERYONE, now=NOW)
    assert by_label(uses)["alice"]["uses"] == 0 and by_label(uses)["bob"]["uses"] == 1  # counted where it began


def test_grouping_by_class_group_and_image(history):
    classes = showback.report(D, D2, by="class", scope=EVERYONE, now=NOW)["rows"]
    assert [(r["key"], r["label"], r["hours"]) for r in classes] == [
        ("", "(no class)", 11.5),
        (str(history["intro"].pk), "Intro", 1.0),
    ]
    groups = by_label(showback.report(D, D2, by="group", scope=EVERYONE, now=NOW))
    # A user's first group (lowest id) that is no role group is the usage group: alice's and
    # bob's cs101 (the seat's block's group too; alice's instructor role is no group of use);
    # carol has none.
    assert {label: row["hours"] for label, row in groups.items()} == {"(no group)": 6.0, "cs101": 6.5}
    assert [r["label"] for r in showback.report(D, D2, by="image", scope=EVERYONE, now=NOW)["rows"]] == ["debian-12"]
    only_runs = showback.report(D, D2, by="user", scope=EVERYONE, filters={"kind": "run"}, now=NOW)
    assert [(r["label"], r["hours"]) for r in only_runs["rows"]] == [("bob", 1.5)]
    with pytest.raises(ValueError):
        showback.report(D, D2, by="host", scope=EVERYONE, now=NOW)


def test_stored_days_equal_the_live_computation(history):
    rollup.backfill(D, D2, now=NOW)
    stored = UsageRollup.objects.filter(kind="class", span="day").get()
    assert (stored.username, stored.class_id, stored.class_name, stored.seconds) == (
        "bob",
        history["intro"].pk,
        "Intro",
        3600,
    )
    assert UsageRollup.objects.filter(kind="vm", span="day").get().gpu_seconds == 6 * 3600 * 2
    for by in showback.GROUPINGS:
        for filters in ({}, {"kind": "class"}, {"image": "debian-12", "group": "cs101"}):
            live = showback.report(D, D2, by=by, scope=EVERYONE, filters=filters, now=NOW, stored=False)
            assert showback.report(D, D2, by=by, scope=EVERYONE, filters=filters, now=NOW) == live
    # Stored figures are what the report reads (no silent recomputation).
    UsageRollup.objects.filter(kind="vm", span="day").update(seconds=3600)
    assert by_label(showback.report(D, D2, by="user", scope=EVERYONE, now=NOW))["carol"]["hours"] == 1.0


def test_today_is_computed_live_up_to_now(history):
    now = at(D1, 1)
    rollup.backfill(D, D1, now=now)  # stores D only
    assert by_label(showback.report(D1, D1, by="user", scope=EVERYONE, now=now))["alice"]["hours"] == 1.0


def test_cost_comes_from_the_prices_and_is_absent_without(history, settings):
    report = showback.report(D, D2, by="user", scope=EVERYONE, now=NOW)
    assert report["prices"] is None and report["totals"]["cost"] is None
    assert "cost" not in showback.csv_text(report).splitlines()[0]
    settings.USAGE_PRICES, settings.USAGE_CURRENCY = PRICES, "EUR"
    report = showback.report(D, D2, by="user", scope=EVERYONE, now=NOW)
    # carol: 6 h × 0.1 + 48 vCPU-h × 0.01 + 48 GiB-h × 0.005 + 12 GPU-h × 0.5
    assert by_label(report)["carol"]["cost"] == round(0.6 + 0.48 + 0.24 + 6.0, 2)
    assert by_label(report)["bob"]["cost"] == round(0.25 + 0.07 + 0.035, 2)
    assert report["currency"] == "EUR" and report["totals"]["cost"] == round(2.52 + 0.355 + 7.32, 2)
    rows = list(csv.reader(io.StringIO(showback.csv_text(report))))
    assert rows[0] == ["user", "name", "hours", "vcpu_hours", "gib_hours", "gpu_hours", "uses", "cost_EUR"]
    assert rows[1] == [str(history["carol"].pk), "carol", "6.0", "48.0", "48.0", "12.0", "1", "7.32"]
    assert rows[-1][:3] == ["total", "", "12.5"]


def test_instructors_see_their_classes_seats_and_their_own_only(history, django_user_model):
    teacher = showback.visible_usage(history["alice"])
    assert teacher.class_ids == {history["intro"].pk}
    rows = showback.report(D, D2, by="user", scope=teacher, now=NOW)["rows"]
    # bob's seat in Intro (1 h), not his own batch run; alice's own reservation; nothing of carol's.
    assert {r["label"]: r["hours"] for r in rows} == {"alice": 4.0, "bob": 1.0}
    # Another course's instructor sees none of cs101's seats.
    other = django_user_model.objects.create_user("dave")
    Group.objects.create(name="chem").user_set.add(other)
    access.set_roles(other, ["instructor"], actor=other)
    assert showback.report(D, D2, by="user", scope=showback.visible_usage(other), now=NOW)["rows"] == []


def test_a_student_sees_only_their_own_and_staff_everything(history, admin_user, django_user_model):
    mine = showback.report(D, D2, by="user", scope=showback.visible_usage(history["bob"]), now=NOW)
    assert [(r["label"], r["hours"]) for r in mine["rows"]] == [("bob", 2.5)]
    carol = showback.report(D, D2, by="image", scope=showback.visible_usage(history["carol"]), now=NOW)
    assert carol["totals"]["hours"] == 6.0
    auditor = django_user_model.objects.create_user("audrey")
    access.set_roles(auditor, ["auditor"], actor=admin_user)
    for viewer in (admin_user, auditor):
        assert showback.visible_usage(viewer).everything
        assert (
            showback.report(D, D2, by="user", scope=showback.visible_usage(viewer), now=NOW)["totals"]["hours"] == 12.5
        )
    rollup.backfill(D, D2, now=NOW)  # the stored path applies the same rule
    assert showback.report(D, D2, by="user", scope=showback.visible_usage(history["bob"]), now=NOW) == mine


def test_a_class_hours_budget_shows_when_classes_have_one(history, image):
    intro = history["intro"]
    Class.objects.filter(pk=intro.pk).update(hours_budget=None)
    report = showback.report(D, D2, by="class", scope=EVERYONE, now=NOW)
    assert report["budgets"] is False and "budget_hours" not in showback.csv_text(report)
    Class.objects.filter(pk=intro.pk).update(hours_budget=40)
    report = showback.report(D, D2, by="class", scope=EVERYONE, now=NOW)
    assert report["budgets"] is True and by_label(report)["Intro"]["budget_hours"] == 40.0
    assert showback.csv_text(report).splitlines()[0].endswith(",budget_hours")
    assert showback.report(D, D2, by="user", scope=EVERYONE, now=NOW)["budgets"] is False


def test_each_students_row_shows_where_their_budget_stands(client, api, history, image):
    """Per student within a class: the hours of their session seats in the range, and beside
    them the budget as the classes app counts it over the term: extra hours, used outside
    sessions (not the seats), left."""
    alice, bob, intro = history["alice"], history["bob"], history["intro"]
    budget.grant_hours(intro, bob, 5, "lab rework", actor=alice, by=alice)
    made(bob, image, at(D1, 9), at(D1, 12), ready=at(D1, 9), stop=at(D1, 12))  # 3 h outside sessions
    students = showback.report(D, D2, by="user", scope=EVERYONE, filters={"class_id": intro.pk}, now=NOW)
    assert students["budgets"] is True and students["standings"] is True
    [row] = students["rows"]
    standing = (row["budget_hours"], row["budget_extra_hours"], row["budget_used_hours"], row["budget_left_hours"])
    assert (row["label"], row["hours"], standing) == ("bob", 1.0, (40.0, 5.0, 3.0, 42.0))
    assert budget.standing(bob, intro).left == 42  # the same figures as the course page's
    lines = list(csv.reader(io.StringIO(showback.csv_text(students))))
    assert lines[0][-4:] == ["budget_hours", "budget_extra_hours", "budget_used_hours", "budget_left_hours"]
    assert lines[1][-4:] == ["40.0", "5.0", "3.0", "42.0"]
    client.force_login(alice)
    page = client.get(f"/reservations/showback/?from=2026-03-10&to=2026-03-12&by=user&class={intro.pk}")
    assert "Used outside sessions (term)" in page.content.decode() and "42.0" in page.content.decode()
    body = api(alice).get(f"/api/v1/usage/showback/?from=2026-03-10&to=2026-03-12&by=user&class={intro.pk}").json()
    assert body["standings"] is True and body["rows"][0]["budget_left_hours"] == 42.0


def test_the_page_and_csv_show_each_viewer_their_scope(client, history, admin_user, settings):
    query = "?from=2026-03-10&to=2026-03-12"
    client.force_login(history["bob"])
    page = client.get("/reservations/showback/" + query).content.decode()
    assert 'id="showback-rows"' in page and "bob" in page and "carol" not in page
    text = client.get("/reservations/showback.csv" + query + "&by=user").content.decode()
    assert [row[1] for row in csv.reader(io.StringIO(text))] == ["name", "bob", ""]
    assert client.get("/reservations/showback/?by=host").status_code == 400
    client.force_login(history["alice"])
    page = client.get("/reservations/showback/" + query + "&by=class").content.decode()
    assert f"class={history['intro'].pk}" in page  # the per-student link
    per_student = client.get(f"/reservations/showback.csv{query}&by=user&class={history['intro'].pk}")
    assert [row[:3] for row in csv.reader(io.StringIO(per_student.content.decode()))][1:] == [
        [str(history["bob"].pk), "bob", "1.0"],
        ["total", "", "1.0"],
    ]
    client.force_login(admin_user)
    assert "carol" in client.get("/reservations/showback/" + query).content.decode()
    settings.USAGE_PRICES, settings.USAGE_CURRENCY = PRICES, "EUR"
    page = client.get("/reservations/showback/" + query).content.decode()
    assert "Cost (EUR)" in page and 'id="showback-cost"' in page
    client.logout()
    assert client.get("/reservations/showback/").status_code == 302  # to the sign-in page


def test_the_api_groups_filters_and_scopes(api, history, admin_user):
    query = "?first=2026-03-10&last=2026-03-12"
    body = api(admin_user).get("/api/v1/usage/showback/" + query + "&by=class").json()
    assert body["by"] == "class" and body["totals"]["hours"] == 12.5 and body["from"] == "2026-03-10"
    assert {r["label"] for r in body["rows"]} == {"Intro", "(no class)"}
    runs = api(admin_user).get("/api/v1/usage/showback/" + query + "&kind=run").json()
    assert [(r["label"], r["vcpu_hours"]) for r in runs["rows"]] == [("bob", 6.0)]
    images = api(admin_user).get("/api/v1/usage/showback/?from=2026-03-11&to=2026-03-11&by=image").json()
    assert images["rows"][0]["hours"] == 3.0  # alice 2 h + bob's run 1 h on D+1
    mine = api(history["bob"]).get("/api/v1/usage/showback/" + query).json()
    assert [r["label"] for r in mine["rows"]] == ["bob"] and mine["totals"]["hours"] == 2.5
    seats = api(history["alice"]).get(f"/api/v1/usage/showback/{query}&class={history['intro'].pk}").json()
    assert [(r["label"], r["hours"]) for r in seats["rows"]] == [("bob", 1.0)]
    for bad in ("&by=host", "&kind=nope", "&class=x", "&from=2026-13-01", "&first=2026-03-12&last=2026-03-10"):
        assert api(admin_user).get("/api/v1/usage/showback/?" + bad).status_code == 400, bad
    text = api(history["bob"]).get("/api/v1/usage/showback/csv/" + query).content.decode()
    assert text.splitlines()[0].startswith("user,name,hours") and "carol" not in text


def test_anonymous_callers_get_nothing(client):
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/usage/showback/").status_code in (401, 403)
    assert APIClient().get("/api/v1/usage/showback/csv/").status_code in (401, 403)
    assert showback.visible_usage(None) == showback.Scope()
    assert not UsageRollup.objects.filter(showback.Scope().q()).exists()


def test_a_whole_stored_month_is_read_from_its_month_rows(history):
    later = datetime(2026, 4, 3, tzinfo=NOW.tzinfo)
    march = (date(2026, 3, 1), date(2026, 3, 31))
    rollup.backfill(date(2026, 2, 25), date(2026, 4, 2), now=later)
    month = UsageRollup.objects.filter(span="month", day=march[0])
    assert month.get(kind="vm").seconds == 6 * 3600 and month.filter(kind="reservation").get().uses == 1
    for by in showback.GROUPINGS:
        live = showback.report(date(2026, 2, 27), date(2026, 4, 2), by=by, scope=EVERYONE, now=later, stored=False)
        assert showback.report(date(2026, 2, 27), date(2026, 4, 2), by=by, scope=EVERYONE, now=later) == live
    # The month row is what a range holding all of March reads; a range cutting it reads days.
    month.filter(kind="vm").update(seconds=3600)
    assert by_label(showback.report(*march, by="user", scope=EVERYONE, now=later))["carol"]["hours"] == 1.0
    assert by_label(showback.report(D, D2, by="user", scope=EVERYONE, now=later))["carol"]["hours"] == 6.0
    # Storing a day again rebuilds its month from the day rows.
    rollup.aggregate(D, now=later)
    assert by_label(showback.report(*march, by="user", scope=EVERYONE, now=later))["carol"]["hours"] == 6.0


def test_the_csv_writes_names_a_spreadsheet_would_run_as_text(client, history, admin_user):
    from provisioning.models import Image

    link = '=HYPERLINK("http://evil.example/","report")'
    Image.objects.filter(name="debian-12").update(name=link)
    client.force_login(admin_user)
    response = client.get("/reservations/showback.csv?from=2026-03-10&to=2026-03-12&by=image")
    rows = list(csv.reader(io.StringIO(response.content.decode(), newline="")))
    assert rows[1][:3] == ["'" + link, "'" + link, "12.5"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"vcpu_hour": 0.01, "hour": 0}, None),
        ([0.01], "expected a JSON object"),
        ({"cpu_hour": 1}, "unknown unit 'cpu_hour'"),
        ({"gpu_hour": -1}, "gpu_hour: a price is a number"),
        ({"gib_hour": "0.1"}, "gib_hour: a price is a number"),
        ({"hour": True}, "hour: a price is a number"),
    ],
)
def test_prices_are_checked_when_read(value, problem, settings):
    from core.env import price_map_errors

    assert settings.USAGE_PRICE_UNITS == showback.PRICE_UNITS  # the settings name them, not import them
    found = price_map_errors(value, settings.USAGE_PRICE_UNITS)
    assert found is None if problem is None else problem in found


def test_days_stored_before_showback_existed_are_computed_live_until_stored_again(history):
    from reservations.models import UsagePeak

    # An upgraded site: the usage report's days are stored (its marks), showback's are not.
    UsagePeak.objects.create(day=D, image=None, group=None, peak=0)
    assert showback.stored_days(D, D) == set()
    assert by_label(showback.report(D, D, by="user", scope=EVERYONE, now=NOW))["carol"]["hours"] == 6.0
    rollup.backfill(D, D, now=NOW)
    assert showback.stored_days(D, D) == {D} and UsageRollup.objects.filter(span="mark").count() == 1
    assert by_label(showback.report(D, D, by="user", scope=EVERYONE, now=NOW))["carol"]["hours"] == 6.0
    assert "(nobody)" not in by_label(showback.report(D, D, by="user", scope=EVERYONE, now=NOW))  # marks: no figures


def test_a_class_id_out_of_range_is_refused_not_an_error(client, api, history, admin_user):
    """Over stored days a huge id would overflow the database's integer: a 400, as the API's."""
    client.force_login(admin_user)
    query = "?from=2026-03-10&to=2026-03-12&by=user&class="
    for bad in (str(2**64), str(2**53 + 1), "0", "-5"):
        assert client.get("/reservations/showback/" + query + bad).status_code == 400, bad
        assert client.get("/reservations/showback.csv" + query + bad).status_code == 400, bad
        assert api(admin_user).get("/api/v1/usage/showback/" + query + bad).status_code == 400, bad
    assert client.get("/reservations/showback/" + query + str(2**53)).status_code == 200
