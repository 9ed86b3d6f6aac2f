"""The self-service pages: who sees what, the reserve form and its fit check, bad input,
double submits, the detail page's connection details and actions, blocks, admin."""

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client
from django.utils import timezone

from provisioning import services as vms
from provisioning.models import QuotaRule
from reservations import services
from reservations.models import BlockAllocation, Reservation
from tests.images import sim_image

pytestmark = pytest.mark.django_db
H = timedelta(hours=1)


def page(client, user, url, status=200):
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == status, response.content.decode()[:500]
    return response.content.decode()


def form_data(image, **extra):
    data = {
        "image": image.pk,
        "when": "now",
        "start": "",
        "duration": 60,
        "ssh_key": "",
        "request_key": str(uuid.uuid4()),
    }
    data.update(extra)
    return data


def local_input(moment):
    return timezone.localtime(moment).strftime("%Y-%m-%dT%H:%M")


@pytest.fixture
def ready(sim_host, image, alice, sync_jobs):
    reservation = services.reserve(alice, image, actor=alice, duration=2 * H)
    sync_jobs.drain()
    reservation.refresh_from_db()
    assert reservation.status == "ready", reservation.error
    return reservation


@pytest.fixture
def future(sim_host, image, alice):
    start = timezone.now() + 5 * H
    return services.reserve(alice, image, actor=alice, start=start, duration=H)


# --- permissions ------------------------------------------------------------------------

URLS = ["/reservations/", "/reservations/images/", "/reservations/new/", "/reservations/new/fit/", "/reservations/1/",
        "/reservations/1/panel/", "/reservations/1/connect.rdp", "/reservations/blocks/"]  # fmt: skip
POSTS = ["/reservations/new/", "/reservations/1/extend/", "/reservations/1/end/", "/reservations/1/cancel/",
         "/reservations/blocks/", "/reservations/blocks/1/seat/", "/reservations/blocks/1/cancel/"]  # fmt: skip


@pytest.mark.parametrize("url", URLS)
def test_anonymous_visitors_are_sent_to_the_login(client, url):
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


@pytest.mark.parametrize("url", POSTS)
def test_anonymous_posts_are_sent_to_the_login_and_change_nothing(client, url):
    response = client.post(url, {})
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert not Reservation.objects.exists()


def test_a_stranger_gets_404_for_someone_elses_reservation_on_every_view(client, ready, bob, sync_jobs):
    pk = ready.pk
    for url in (f"/reservations/{pk}/", f"/reservations/{pk}/panel/", f"/reservations/{pk}/connect.rdp"):
        page(client, bob, url, status=404)
    for url in (f"/reservations/{pk}/extend/", f"/reservations/{pk}/end/", f"/reservations/{pk}/cancel/"):
        assert client.post(url, {"minutes": 30}).status_code == 404
    sync_jobs.drain()
    after = Reservation.objects.get(pk=pk)
    assert after.status == "ready" and after.end == ready.end
    listing = page(client, bob, "/reservations/?show=all")
    assert f'id="reservation-{pk}"' not in listing and "No reservations" in listing


def test_staff_see_any_reservation_and_everyones_list(client, ready, admin_user):
    assert "alice" in page(client, admin_user, "/reservations/?everyone=1")
    assert f'id="reservation-{ready.pk}"' not in page(client, admin_user, "/reservations/")  # "mine" by default
    page(client, admin_user, f"/reservations/{ready.pk}/")


def test_ids_beyond_the_column_range_are_404(client, alice):
    page(client, alice, f"/reservations/{2**64}/", status=404)
    page(client, alice, f"/reservations/{2**64}/panel/", status=404)


def test_forms_are_csrf_protected(sim_host, image, alice, ready):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post("/reservations/new/", form_data(image)).status_code == 403
    assert client.post(f"/reservations/{ready.pk}/end/").status_code == 403
    assert Reservation.objects.count() == 1 and Reservation.objects.get().status == "ready"
    assert "csrfmiddlewaretoken" in client.get("/reservations/new/").content.decode()
    detail = client.get(f"/reservations/{ready.pk}/").content.decode()
    assert detail.count("csrfmiddlewaretoken") >= 3  # extend, end, log out


# --- the catalogue ----------------------------------------------------------------------


def test_the_catalogue_shows_only_usable_images_and_filters(client, image, alice):
    staff = Group.objects.create(name="staff-only")
    sim_image("secret-img", location="sim://x", size_gib=1, visibility="restricted", groups=[staff])
    sim_image("alma-9", location="sim://y", size_gib=1, os="AlmaLinux 9", platform="aarch64")
    listing = page(client, alice, "/reservations/images/")
    assert "debian-12" in listing and "alma-9" in listing and "secret-img" not in listing
    assert f'href="/reservations/new/?image={image.pk}"' in listing
    listing = page(client, alice, "/reservations/images/?os=AlmaLinux+9")
    assert "alma-9" in listing and "debian-12" not in listing
    listing = page(client, alice, "/reservations/images/?platform=x86_64&q=debian")
    assert "debian-12" in listing and "alma-9" not in listing


# --- reserving --------------------------------------------------------------------------


def test_the_form_offers_durations_within_the_users_limit(client, image, alice):
    form = page(client, alice, f"/reservations/new/?image={image.pk}")
    assert "At most 8 h (the site default)" in form and '<option value="480">8 h</option>' in form
    assert 'name="request_key"' in form and 'value="720"' not in form
    students = Group.objects.create(name="students")
    alice.groups.add(students)
    QuotaRule.objects.create(name="short", group=students, max_duration_minutes=100)
    form = page(client, alice, f"/reservations/new/?image={image.pk}")
    assert "At most 1 h 40 min (rule &#x27;short&#x27;)" in form
    assert '<option value="100">1 h 40 min</option>' in form and 'value="120"' not in form


def test_reserving_now_redirects_to_the_reservation(client, sim_host, image, alice, sync_jobs):
    client.force_login(alice)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK alice@laptop"
    response = client.post("/reservations/new/", form_data(image, ssh_key=key))
    reservation = Reservation.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/reservations/{reservation.pk}/"
    assert reservation.user == alice and reservation.status == "provisioning" and reservation.ssh_key == key
    assert reservation.duration == H


def test_reserving_later_makes_a_pending_reservation(client, sim_host, image, alice):
    client.force_login(alice)
    start = (timezone.now() + 3 * H).replace(second=0, microsecond=0)
    client.post("/reservations/new/", form_data(image, when="later", start=local_input(start), duration=120))
    reservation = Reservation.objects.get()
    assert reservation.status == "pending" and reservation.start == start and reservation.end == start + 2 * H


def test_a_double_submit_makes_one_reservation(client, sim_host, image, alice, sync_jobs):
    client.force_login(alice)
    data = form_data(image)
    first = client.post("/reservations/new/", data)
    second = client.post("/reservations/new/", data)
    assert Reservation.objects.count() == 1
    assert first["Location"] == second["Location"] == f"/reservations/{Reservation.objects.get().pk}/"


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"when": "later", "start": "-2h"}, "start", "the start is in the past"),
        ({"when": "later", "start": ""}, "start", "give a start, or choose now"),
        ({"when": "later", "start": "tomorrow-ish"}, "start", "Enter a valid date/time"),
        ({"duration": 600}, "duration", "Select a valid choice"),
        ({"duration": "abc"}, "duration", "Select a valid choice"),
        ({"ssh_key": "not a key"}, "ssh_key", "an OpenSSH public key"),
        ({"when": "sometime"}, "when", "Select a valid choice"),
    ],
)
def test_bad_input_is_refused_per_field_and_nothing_is_made(client, sim_host, image, alice, extra, field, message):
    client.force_login(alice)
    if extra.get("start") == "-2h":
        extra["start"] = local_input(timezone.now() - 2 * H)
    response = client.post("/reservations/new/", form_data(image, **extra))
    assert response.status_code == 200
    html = response.content.decode()
    assert message in html.split(f'id="error-{field}"')[1].split("</p>")[0]
    assert not Reservation.objects.exists()


def test_an_image_the_user_may_not_use_is_refused(client, sim_host, image, alice):
    vms.update_image(image, actor="test", visibility="restricted", groups=[Group.objects.create(name="others")])
    client.force_login(alice)
    html = client.post("/reservations/new/", form_data(image)).content.decode()
    assert "Select a valid choice" in html.split('id="error-image"')[1] and not Reservation.objects.exists()


def test_a_quota_refusal_names_the_rule(client, sim_host, image, alice, sync_jobs):
    QuotaRule.objects.create(name="one at a time", max_per_user=1)
    services.reserve(alice, image, actor=alice, duration=H)
    client.force_login(alice)
    html = client.post("/reservations/new/", form_data(image)).content.decode()
    assert "at most 1 (rule &#x27;one at a time&#x27;)" in html.split('id="error-start"')[1]
    assert Reservation.objects.count() == 1


# --- the fit check ----------------------------------------------------------------------


def fit(client, user, image, **params):
    client.force_login(user)
    query = {"image": image.pk, "when": "now", "duration": 60, **params}
    response = client.get("/reservations/new/fit/", query)
    assert response.status_code == 200
    return response.content.decode()


def test_the_fit_check_says_it_fits(client, sim_host, image, alice):
    html = fit(client, alice, image)
    assert 'data-fit="yes"' in html and "Fits: a host has room" in html
    assert not Reservation.objects.exists()


def test_the_fit_check_gives_the_reason_and_the_earliest_start(client, sim_host, image, alice, bob, sync_jobs):
    first = services.reserve(alice, image, actor=alice, duration=2 * H, size={"memory_mib": 6144})
    html = fit(client, bob, image)  # bob's 2048 MiB: 8192 - 6144 leaves room
    assert 'data-fit="yes"' in html
    services.reserve(alice, image, actor=alice, duration=2 * H, size={"memory_mib": 2048})
    html = fit(client, bob, image)
    assert 'data-fit="no"' in html and "host has room then (1 lack memory)" in html
    earliest = re.search(r'data-start="([0-9T:-]+)"', html).group(1)
    # Rounded up to the minute (an end at 14:30:00.4 gives 14:31).
    assert earliest == local_input(first.end + timedelta(minutes=1, microseconds=-1))
    assert "Use the earliest start" in html
    later = fit(client, bob, image, when="later", start=earliest)
    assert 'data-fit="yes"' in later


def test_the_fit_check_shows_rule_and_window_errors(client, sim_host, image, alice):
    html = fit(client, alice, image, when="later", start=local_input(timezone.now() - 3 * H))
    assert 'data-fit="refused"' in html and "the start is in the past" in html
    html = fit(client, alice, image, duration=999)
    assert 'data-fit="refused"' in html and "valid choice" in html


# --- my reservations --------------------------------------------------------------------


def test_the_list_shows_live_badges_and_subscribes_to_the_users_topic(client, ready, future, alice):
    listing = page(client, alice, "/reservations/")
    assert f'data-topics="user.{alice.pk}"' in listing
    row = listing.split(f'id="reservation-{ready.pk}"')[1].split("</tr>")[0]
    assert 'class="badge res-ready"' in row and f'data-vm="{ready.vm_id}"' in listing
    assert f'id="reservation-{future.pk}"' in listing
    services.cancel(future, actor=alice)
    assert f'id="reservation-{future.pk}"' not in page(client, alice, "/reservations/")
    assert f'id="reservation-{future.pk}"' in page(client, alice, "/reservations/?show=past")


def test_the_list_costs_the_same_queries_for_many_reservations(
    client, sim_host, image, alice, django_assert_max_num_queries
):
    for hours in range(2):
        services.reserve(alice, image, actor=alice, start=timezone.now() + (3 + hours * 2) * H, duration=H)
    client.force_login(alice)
    with django_assert_max_num_queries(8) as few:
        client.get("/reservations/?show=all")
    for hours in range(2, 8):
        services.reserve(alice, image, actor=alice, start=timezone.now() + (3 + hours * 2) * H, duration=H)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get("/reservations/?show=all").content.decode().count('class="badge res-pending"') == 8


def test_the_detail_of_a_ready_one_shows_how_to_connect(client, ready, alice):
    html = page(client, alice, f"/reservations/{ready.pk}/")
    details = services.connection(ready)
    assert details["address"] in html and f"ssh alice@{details['address']}" in html
    assert f'data-secret="{details["password"]}"' in html and 'class="copy"' in html
    assert html.count("data-step=") == 4 and '<li class="current" data-step="running">' in html
    assert "reserved on sim-1" in html and "ready on sim-1" in html  # the history with reasons
    assert 'id="end-now"' in html and 'id="cancel"' not in html and 'id="extend-form"' in html
    assert f'data-topics="reservation.{ready.pk},user.{alice.pk}"' in html
    assert 'id="ending-warning" class="warning-banner" hidden' in " ".join(html.split())
    panel = page(client, alice, f"/reservations/{ready.pk}/panel/")
    assert panel.lstrip().startswith('<div id="reservation-panel"') and "<html" not in panel


def test_the_end_warning_shows_when_the_end_is_near(client, sim_host, image, alice, sync_jobs):
    reservation = services.reserve(alice, image, actor=alice, duration=timedelta(minutes=5))
    sync_jobs.drain()
    html = " ".join(page(client, alice, f"/reservations/{reservation.pk}/").split())
    assert 'id="ending-warning" class="warning-banner" data-end' in html


def test_windows_images_get_an_rdp_file(client, sim_host, image, alice, ready, sync_jobs):
    page(client, alice, f"/reservations/{ready.pk}/connect.rdp", status=404)  # a Linux image: SSH
    vms.update_image(image, actor="test", os="Windows Server 2022")
    html = page(client, alice, f"/reservations/{ready.pk}/")
    assert f"mstsc /v:{ready.vm.address}" in html and f"/reservations/{ready.pk}/connect.rdp" in html
    response = client.get(f"/reservations/{ready.pk}/connect.rdp")
    assert response["Content-Type"] == "application/x-rdp" and "attachment" in response["Content-Disposition"]
    assert f"full address:s:{ready.vm.address}" in response.content.decode()


def test_extend_moves_the_end_or_says_why_not(client, ready, image, alice, bob, sync_jobs):
    client.force_login(alice)
    response = client.post(f"/reservations/{ready.pk}/extend/", {"minutes": 60}, follow=True)
    assert "Extended to" in response.content.decode()
    assert Reservation.objects.get(pk=ready.pk).end == ready.end + H
    services.reserve(bob, image, actor=bob, start=ready.end + H, duration=H, size={"memory_mib": 8192})
    client.force_login(alice)
    html = client.post(f"/reservations/{ready.pk}/extend/", {"minutes": 60}, follow=True).content.decode()
    assert "Not extended: cannot extend to" in html and "no host has room then" in html
    html = client.post(f"/reservations/{ready.pk}/extend/", {"minutes": 7}, follow=True).content.decode()
    assert "Extend by: Select a valid choice" in html
    assert Reservation.objects.get(pk=ready.pk).end == ready.end + H


def test_end_now_tears_the_vm_down(client, ready, alice, sync_jobs):
    client.force_login(alice)
    response = client.post(f"/reservations/{ready.pk}/end/")
    assert response.status_code == 302 and Reservation.objects.get(pk=ready.pk).status == "ending"
    sync_jobs.drain()
    html = page(client, alice, f"/reservations/{ready.pk}/")
    assert "badge res-ended" in html and 'id="end-now"' not in html and "ended: VM destroyed" in html
    html = client.post(f"/reservations/{ready.pk}/end/", follow=True).content.decode()
    assert "is already ended" in html


def test_a_future_one_is_canceled_and_a_started_one_cannot_be(client, future, ready, alice):
    client.force_login(alice)
    assert 'id="cancel"' in page(client, alice, f"/reservations/{future.pk}/")
    client.post(f"/reservations/{future.pk}/cancel/")
    assert Reservation.objects.get(pk=future.pk).status == "canceled"
    html = client.post(f"/reservations/{ready.pk}/cancel/", follow=True).content.decode()
    assert "end it instead" in html and Reservation.objects.get(pk=ready.pk).status == "ready"


# --- blocks -----------------------------------------------------------------------------


@pytest.fixture
def instructor(django_user_model):
    user = django_user_model.objects.create_user("ivy", "ivy@example.org", "ivy-pass-1")
    user.user_permissions.add(Permission.objects.get(codename="add_blockallocation"))
    return user


def block_data(image, group, **extra):
    start = (timezone.now() + 24 * H).replace(second=0, microsecond=0)
    data = {
        "name": "CS101 lab",
        "image": image.pk,
        "group": group.pk,
        "seats": 2,
        "start": local_input(start),
        "end": local_input(start + 2 * H),
        "weeks": 2,
    }
    data.update(extra)
    return data


def test_only_managers_create_blocks(client, sim_host, image, alice):
    klass = Group.objects.create(name="cs101")
    html = page(client, alice, "/reservations/blocks/")
    assert 'id="block-form"' not in html and "None of your groups" in html
    assert client.post("/reservations/blocks/", block_data(image, klass)).status_code == 403
    assert not BlockAllocation.objects.exists()


def test_an_instructor_creates_a_block_and_a_member_takes_a_seat(client, sim_host, image, instructor, alice, bob):
    klass = Group.objects.create(name="cs101")
    instructor.groups.add(klass)
    bob.groups.add(klass)
    client.force_login(instructor)
    response = client.post("/reservations/blocks/", block_data(image, klass, seats=3))
    assert response.status_code == 302
    block = BlockAllocation.objects.get()
    assert block.seat_reservations.count() == 6
    assert "week 1: 2/3 taken" in page(client, instructor, "/reservations/blocks/")  # ivy and bob were members
    assert "my seat" in page(client, bob, "/reservations/blocks/")
    alice.groups.add(klass)
    assert "Take a seat" in page(client, alice, "/reservations/blocks/")
    response = client.post(f"/reservations/blocks/{block.pk}/seat/")
    seat = Reservation.objects.get(block=block, user=alice, occurrence=0)
    assert response["Location"] == f"/reservations/{seat.pk}/"
    assert "my seat" in page(client, alice, "/reservations/blocks/")
    assert "week 1: 3/3 taken" in page(client, instructor, "/reservations/blocks/")


def test_block_errors_are_shown_per_field(client, sim_host, image, instructor):
    klass = Group.objects.create(name="cs101")
    instructor.groups.add(klass)
    client.force_login(instructor)
    html = client.post("/reservations/blocks/", block_data(image, klass, seats=50)).content.decode()
    assert "does not fit" in html.split('id="error-seats"')[1]
    start = timezone.now() - 3 * H
    html = client.post("/reservations/blocks/", block_data(image, klass, start=local_input(start))).content.decode()
    assert "the start is in the past" in html.split('id="error-start"')[1]
    other = Group.objects.create(name="not-mine")
    html = client.post("/reservations/blocks/", block_data(image, other)).content.decode()
    assert "Select a valid choice" in html.split('id="error-group"')[1]
    assert not BlockAllocation.objects.exists() and not Reservation.objects.exists()


def test_a_stranger_cannot_take_a_seat_or_cancel_a_block(client, sim_host, image, instructor, bob):
    klass = Group.objects.create(name="cs101")
    block = services.create_block(
        actor=instructor,
        name="lab",
        image=image,
        group=klass,
        seats=1,
        start=timezone.now() + 24 * H,
        end=timezone.now() + 26 * H,
    )
    client.force_login(bob)
    assert client.post(f"/reservations/blocks/{block.pk}/seat/").status_code == 404
    assert client.post(f"/reservations/blocks/{block.pk}/cancel/").status_code == 403
    assert not BlockAllocation.objects.get().canceled and not Reservation.objects.filter(user=bob).exists()


# --- admin ------------------------------------------------------------------------------


def test_the_admin_lists_reservations_and_never_shows_the_password(client, ready, admin_user):
    client.force_login(admin_user)
    assert "debian-12" in client.get("/admin/reservations/reservation/?status__exact=ready").content.decode()
    html = client.get(f"/admin/reservations/reservation/{ready.pk}/change/").content.decode()
    assert "set (encrypted)" in html and "ready on sim-1" in html
    assert ready.connect_secret not in html and ready.get_password() not in html
    assert client.get("/admin/reservations/blockallocation/").status_code == 200
    assert client.get("/admin/vms/quotarule/add/").status_code == 200
