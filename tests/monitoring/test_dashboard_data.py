"""The admin dashboard's numbers on a small inventory, who may read them, and their query budget."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from capacity import services as capacity
from capacity.models import Allocation
from inventory import services as inventory
from jobs.models import Job
from monitoring import dashboard
from provisioning import services as vms
from provisioning import warm
from reservations import services as reservations
from reservations.models import Reservation
from tests.conftest import TEST
from tests.images import sim_image
from tests.monitoring.helpers import samples, value
from tests.reservations import conftest as reservation_fixtures

# A simulated image, as the reservations tests have it.
image = reservation_fixtures.image

H = timedelta(hours=1)
URL = "/dashboard/data/"


def claim(host, vcpus, memory_mib, disk_gib, start=None, end=None):
    start = start or timezone.now()
    demand = capacity.Demand(vcpus, memory_mib, disk_gib, start=start, end=end, purpose="test")
    return capacity.claim_on_host(host, demand, actor=TEST)


@pytest.fixture
def inventory_(group, chassis, make_host):
    """bc1: s1 (lab, online), s3 (lab, drained, memory reserved and overcommitted); loose: one online
    host in the default group, one offline host holding an allocation that must count nothing."""
    s1 = make_host("bc1-s01", blade_center=chassis, slot=1, group=group)  # 16 cpus ×4, 64 GiB, 500 GiB
    s3 = make_host("bc1-s03", blade_center=chassis, slot=3, group=group, reserved_memory_mib=4096, memory_ratio=1.5)
    loose = make_host("loose-1", cpus=8, memory_mib=16384, disk_gib=100, cpu_ratio=2.0, reserved_cpus=1)
    gone = make_host("loose-off", cpus=8, memory_mib=16384, disk_gib=100)
    claim(s1, 8, 8192, 50, end=timezone.now() + 2 * H)
    claim(s1, 4, 4096, 20)  # open-ended
    claim(s3, 2, 2048, 10, end=timezone.now() + H)
    claim(loose, 1, 1024, 5, end=timezone.now() + H)
    claim(gone, 2, 2048, 10)
    claim(s1, 16, 16384, 100, start=timezone.now() + 5 * H, end=timezone.now() + 6 * H)  # future: not now
    released = claim(loose, 4, 4096, 40)
    capacity.release(released, actor=TEST)
    now = timezone.now()  # over its end but not released: its VM is not known gone, so it still holds its room
    Allocation.objects.create(
        host=loose, purpose="old", vcpus=3, memory_mib=3000, disk_gib=3, start=now - 3 * H, end=now - H
    )
    inventory.set_state(s3, "drained", "maintenance", actor=TEST)
    inventory.set_state(gone, "offline", "dead PSU", actor=TEST)
    return {"s1": s1, "s3": s3, "loose": loose, "gone": gone}


def test_utilisation_is_allocated_now_against_usable_capacity(inventory_):
    util = dashboard.gather()["utilisation"]
    overall = util["overall"]
    assert overall["hosts"] == 4 and overall["states"] == {"online": 2, "drained": 1, "offline": 1}
    assert overall["vms"] == 5
    # usable: s1 64 vCPU, s3 64, loose (8-1)×2 = 14; the offline host counts nothing
    assert overall["vcpus"] == {"used": 18, "usable": 142, "ratio": round(18 / 142, 4)}
    assert overall["memory_mib"]["used"] == 8192 + 4096 + 2048 + 1024 + 3000
    assert overall["memory_mib"]["usable"] == 65536 + (65536 - 4096) * 1.5 + 16384
    assert overall["disk_gib"] == {"used": 88, "usable": 1100, "ratio": round(88 / 1100, 4)}
    groups = {g["name"]: g for g in util["groups"]}
    assert set(groups) == {"default", "lab"}
    assert (
        groups["lab"]["hosts"] == 2 and groups["lab"]["vcpus"]["used"] == 14 and groups["lab"]["vcpus"]["usable"] == 128
    )
    assert groups["default"]["hosts"] == 2 and groups["default"]["states"]["offline"] == 1
    assert groups["default"]["vcpus"] == {"used": 4, "usable": 14, "ratio": round(4 / 14, 4)}


def test_the_heat_map_places_hosts_by_chassis_and_slot(inventory_, chassis):
    rows = dashboard.gather()["heatmap"]["rows"]
    assert [r["name"] for r in rows] == ["bc1", "no chassis"]
    slots = rows[0]["slots"]
    assert len(slots) == 16 and slots[1] is None and all(s is None for s in slots[3:])
    s1, s3 = slots[0], slots[2]
    assert s1["name"] == "bc1-s01" and s1["state"] == "online" and s1["vms"] == 2
    assert s1["ratios"] == {"vcpus": 12 / 64, "memory_mib": round(12288 / 65536, 4), "disk_gib": 70 / 500}
    assert s1["utilisation"] == round(12288 / 65536, 4)  # the tightest resource
    assert s3["state"] == "drained" and s3["slot"] == 3
    loose = {h["name"]: h for h in rows[1]["slots"]}
    assert set(loose) == {"loose-1", "loose-off"} and loose["loose-off"]["state"] == "offline"
    assert loose["loose-1"]["ratios"]["vcpus"] == round(4 / 14, 4)


def test_a_host_without_room_reads_full():
    assert dashboard._ratio(1, 0) == 1.0 and dashboard._ratio(0, 0) == 0.0


def test_the_timeline_counts_reservations_per_hour_by_status(db, image, alice):
    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    hour = now.replace(minute=0)

    def make(status, start, end):
        return Reservation.objects.create(
            user=alice, image=image, start=start, end=end, status=status, vcpus=1, memory_mib=512, disk_gib=5
        )

    make("ready", now - 2 * H, now + H)  # hours 0 and 1
    make("provisioning", now, now + 30 * timedelta(minutes=1))  # hour 0 (ends on the hour)
    make("pending", hour + 24 * H, hour + 26 * H)  # hours 24 and 25
    make("pending", hour + 71 * H, hour + 80 * H)  # the last hour only
    make("ended", now - H, now + H)  # over: not counted
    make("canceled", hour + 3 * H, hour + 4 * H)
    make("pending", hour + 100 * H, hour + 101 * H)  # beyond the window
    timeline = dashboard.timeline(now)
    assert len(timeline["hours"]) == 72 and timeline["start"] == hour.isoformat()
    series = timeline["series"]
    assert series["running"][:3] == [1, 1, 0] and sum(series["running"]) == 2
    assert series["starting"][:2] == [1, 0] and sum(series["starting"]) == 1
    assert series["booked"][23:27] == [0, 1, 1, 0] and series["booked"][71] == 1 and sum(series["booked"]) == 3
    assert timeline["now"] == 2


def test_the_job_queue_counts_running_waiting_and_recent_failures(db, alice):
    now = timezone.now()
    for status in ("running", "running", "queued", "waiting", "success"):
        Job.objects.create(opcode="test.noop", status=status, submitter=alice)
    Job.objects.create(opcode="test.fail", status="error", ended=now - H, error_message="boom")
    Job.objects.create(opcode="test.fail", status="error", ended=now - 48 * H)
    jobs = dashboard.job_queue(now, latest=3)
    assert (jobs["running"], jobs["queued"], jobs["waiting"], jobs["failed_24h"]) == (2, 1, 1, 1)
    assert [j["opcode"] for j in jobs["latest"]] == ["test.fail", "test.fail", "test.noop"]
    assert jobs["latest"][1]["error"] == "boom" and jobs["latest"][2]["submitter"] == "alice"


def test_staff_get_the_numbers(client, admin_user, inventory_):
    client.force_login(admin_user)
    response = client.get(URL)
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    data = response.json()
    assert set(data) == {"generated", "utilisation", "heatmap", "timeline", "jobs", "warm_pools"}
    assert data["utilisation"]["overall"]["vcpus"]["used"] == 18
    page = client.get(reverse("home"))
    assert b'id="dashboard-data"' in page.content and b"js/dashboard.js" in page.content


def test_it_refuses_the_numbers_to_a_non_staff_user(client, alice, inventory_):
    client.force_login(alice)
    assert client.get(URL).status_code == 403
    page = client.get(reverse("home"))
    assert page.status_code == 200 and b"dashboard-data" not in page.content and b'id="activity"' in page.content
    assert b"bc1-s01" not in page.content
    assert b"Warm pools" not in page.content and b'id="dash-warm' not in page.content


def test_it_sends_a_stranger_to_the_login(client, db):
    response = client.get(URL)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_numbers_take_a_fixed_number_of_queries(admin_user, client, chassis, group, make_host, image, alice):
    client.force_login(admin_user)
    client.get(URL)  # the queue settings row, sessions: made once
    # (a pooled image from the start: its pool's history is read once, for every pooled image)
    vms.update_image(sim_image("pooled-0", os="Debian 12"), actor=TEST, warm_min=1, warm_max=2)

    def count():
        with CaptureQueriesContext(connection) as queries:
            dashboard.gather()
        return len(queries)

    few = count()
    for slot in range(2, 12):
        host = make_host(blade_center=chassis, slot=slot, group=group)
        claim(host, 1, 512, 1)
    make_host()
    start = timezone.now()
    for i in range(5):
        Reservation.objects.create(
            user=alice,
            image=image,
            start=start + i * H,
            end=start + (i + 2) * H,
            status="pending",
            vcpus=1,
            memory_mib=512,
            disk_gib=5,
        )
        Job.objects.create(opcode="test.noop", status="running")
    for name in ("pooled-1", "pooled-2"):
        vms.update_image(sim_image(name, os="Debian 12"), actor=TEST, warm_min=1, warm_max=2)
    many = count()
    assert few == many <= dashboard.QUERY_BUDGET
    with CaptureQueriesContext(connection) as queries:
        assert client.get(URL).status_code == 200
    assert len(queries) <= dashboard.QUERY_BUDGET + 3  # + session and user


# --- warm pools ---------------------------------------------------------------------------------


@pytest.fixture
def pools(sim_host, image, alice, bob, sync_jobs):
    """debian-12 keeps 1 to 3 warm VMs: alice took the first (a hit, in use), bob found none (a miss),
    the round made a new one (ready); then the minimum rose to 2, the next one still building.
    A second image keeps no pool."""
    vms.update_image(image, actor=TEST, warm_min=1, warm_max=3)
    warm.fill(image)
    sync_jobs.drain()
    for user in (alice, bob):
        reservations.reserve(user, image, actor=user, duration=2 * H)
    sync_jobs.drain()
    warm.fill(image)
    sync_jobs.drain()
    vms.update_image(image, actor=TEST, warm_min=2)
    warm.fill(image)  # its build not run: building
    sim_image("plain", os="Debian 12", min_memory_mib=256)
    return image


def cells(html, image_name):
    row = re.search(rf'<tr data-image="{image_name}">(.*?)</tr>', html, re.S)
    return row and re.findall(r"<t[hd][^>]*>([^<]*)</t[hd]>", row.group(1))


def test_the_warm_pools_panel_shows_each_pool_as_metrics_count_it(client, admin_user, pools, settings):
    row = {"image": "debian-12", "min": 2, "max": 3, "wanted": 2, "ready": 1, "building": 1, "ahead": 0}
    row.update(in_use=1, hits=1, misses=1)
    assert dashboard.warm_pools() == [row]
    settings.METRICS_TOKEN = "metrics-token-for-the-test-0123456789"  # noqa: S105 (a test token)
    scraped = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_TOKEN}").content.decode()
    found = samples(scraped)
    assert value(found, "vclmgr_warm_vms", image="debian-12", state="building") == row["building"]
    assert value(found, "vclmgr_warm_in_use", image="debian-12") == row["in_use"]
    assert value(found, "vclmgr_warm_wanted", image="debian-12") == row["wanted"]
    assert value(found, "vclmgr_warm_ahead", image="debian-12") == row["ahead"]
    assert value(found, "vclmgr_warm_misses_total", image="debian-12") == row["misses"]
    client.force_login(admin_user)
    assert client.get(URL).json()["warm_pools"] == dashboard.warm_pools()
    html = client.get(reverse("home")).content.decode()
    assert cells(html, "debian-12") == ["debian-12", "2 / 3", "2", "1", "1", "0", "1", "1", "1"]
    assert cells(html, "plain") is None
    assert '<table id="dash-warm">' in html and '<p id="dash-warm-empty" class="muted" hidden>' in html


def test_the_warm_pools_panel_says_when_no_image_pools(client, admin_user, image):
    assert dashboard.warm_pools() == []
    client.force_login(admin_user)
    assert client.get(URL).json()["warm_pools"] == []
    html = client.get(reverse("home")).content.decode()
    assert '<table id="dash-warm" hidden>' in html
    assert '<p id="dash-warm-empty" class="muted">No image keeps a warm pool' in html


def test_it_shows_no_pool_to_a_non_staff_user(client, alice, pools):
    client.force_login(alice)
    assert client.get(URL).status_code == 403
    page = client.get(reverse("home"))
    assert page.status_code == 200 and b"Warm pools" not in page.content and b"dash-warm" not in page.content
