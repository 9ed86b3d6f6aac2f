"""A user reserves a machine in the browser and watches it come up live; a stranger sees nothing.

Real daphne server and real django-q2 worker on the test database; a simulated host whose
``start`` step is slowed, so the status visibly changes after the page has loaded.
Screenshots of the main pages go to ``<VCLMGR_VAR_DIR>/screenshots/``; the ready reservation
is also copied to ``docs/screenshots/reservation.png`` for the docs.
"""

import os
import re
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import expect

from core import events
from drivers.sim import services as sim
from provisioning import services as vms
from provisioning.models import QuotaRule
from reservations.models import Reservation
from tests.e2e.conftest import sign_in
from tests.images import sim_image

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(settings.VAR_DIR) / "screenshots"


@pytest.fixture
def lab(make_host, transactional_db):
    host = make_host("sim-e2e", driver="sim", cpus=16, memory_mib=16384, disk_gib=200)
    sim.set_fault("sim-e2e", "start", "slow", 2)
    image = sim_image(
        "ubuntu-24.04",
        location="sim://library/ubuntu",
        os="Ubuntu 24.04",
        description="Python, gcc, MATLAB",
        default_vcpus=2,
        default_memory_mib=2048,
        default_disk_gib=10,
    )
    sim_image("windows-11", location="sim://library/win11", os="Windows 11", description="Office, Visual Studio")
    return host, image


def shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_a_user_reserves_watches_it_become_ready_connects_and_ends_it(
    lab, alice, bob, worker, asgi_server, browser, login, page
):
    _, image = lab
    console = []
    page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    page.on("websocket", lambda ws: ws.on("framereceived", lambda frame: console.append(f"ws< {frame}")))
    login("alice", "alice-pass-1")
    page.goto("/reservations/images/")
    expect(page.locator("#catalogue .image-card")).to_have_count(2)
    shot(page, "catalogue")
    page.select_option("select[name=os]", "Ubuntu 24.04")
    page.click("#catalogue-filters button[type=submit]")
    expect(page.locator("#catalogue .image-card")).to_have_count(1)
    page.click(f"#image-{image.pk} a.button")
    expect(page.locator("#fit [data-fit=yes]")).to_contain_text("Fits: a host has room")
    expect(page.locator("#duration-limit")).to_contain_text("At most 8 h")
    page.select_option("#id_duration", "120")
    shot(page, "reserve")

    page.click("#reserve-submit")
    page.wait_for_url(re.compile(r"/reservations/\d+/$"), timeout=30000)
    reservation = Reservation.objects.get(user=alice)
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    page.wait_for_selector("html[data-live=subscribed]", state="attached")
    status = page.locator("#reservation-status")
    try:
        expect(status).to_have_text("ready", timeout=30000)
    except AssertionError as error:
        raise AssertionError(
            f"not ready: {Reservation.objects.get(pk=reservation.pk).status}\n"
            f"{asgi_server.output()[-3000:]}\n{worker.output()[-3000:]}"
        ) from error
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
    reservation.refresh_from_db()
    expect(page.locator("#connect-address")).to_have_text(reservation.vm.address)
    expect(page.locator("#connect-command")).to_have_text(f"ssh alice@{reservation.vm.address}")
    expect(page.locator('#steps li[data-step="running"]')).to_have_class("current")
    expect(page.locator("#history")).to_contain_text("ready on sim-e2e")
    path = shot(page, "reservation")
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS"):  # the docs' copy changes only when asked
        (ROOT / "docs" / "screenshots").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, ROOT / "docs" / "screenshots" / "reservation.png")
    page.click("button.reveal")
    expect(page.locator("#connect-password")).to_have_text(reservation.get_password())
    expect(page.locator("#ending-warning")).to_be_hidden()
    events.emit(
        "reservation.ending",
        {"id": reservation.pk, "minutes": 7, "end": reservation.end.isoformat()},
        [f"reservation.{reservation.pk}"],
    )  # what the scheduler's tick sends
    expect(page.locator("#ending-warning")).to_be_visible(timeout=10000)
    expect(page.locator("#ending-warning")).to_contain_text("in about 7 min")

    page.goto("/reservations/")
    row = page.locator(f"#reservation-{reservation.pk}")
    expect(row.locator("[data-field=status]")).to_have_text("ready")
    shot(page, "my-reservations")

    page.goto(f"/reservations/{reservation.pk}/")
    page.wait_for_selector("html[data-live=subscribed]", state="attached")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#end-now")
    expect(page.locator(".messages")).to_contain_text("Ending")
    try:
        expect(page.locator("#reservation-status")).to_have_text("ended", timeout=30000)
    except AssertionError as error:
        from jobs.models import Job

        jobs = list(Job.objects.values_list("pk", "opcode", "status"))
        raise AssertionError(
            f"not ended: {Reservation.objects.get(pk=reservation.pk).status} {jobs}\n"
            f"{worker.output()[-3000:]}\n{asgi_server.output()[-3000:]}\n" + "\n".join(console[-40:])
        ) from error
    expect(page.locator("#connection")).not_to_contain_text(reservation.vm.address)

    # a second user sees nothing of it: not in the list, not by its URL
    other = browser.new_context(base_url=asgi_server.url)
    try:
        stranger = sign_in(other.new_page(), "bob", "bob-pass-1")
        stranger.goto("/reservations/?show=all")
        expect(stranger.locator("#reservations")).to_contain_text("No reservations")
        expect(stranger.locator(f"#reservation-{reservation.pk}")).to_have_count(0)
        response = stranger.goto(f"/reservations/{reservation.pk}/")
        assert response.status == 404
        assert stranger.request.get(f"/reservations/{reservation.pk}/panel/").status == 404
    finally:
        other.close()


def test_the_fit_check_offers_the_earliest_start_and_the_form_uses_it(lab, alice, bob, asgi_server, login, page):
    from datetime import timedelta

    from reservations import services

    _, image = lab
    services.reserve(bob, image, actor=bob, duration=timedelta(hours=2), size={"memory_mib": 15000})
    windows = vms.visible_images(alice).get(name="windows-11")
    QuotaRule.objects.create(name="windows short", image=windows, max_duration_minutes=60)
    login("alice", "alice-pass-1")
    page.goto(f"/reservations/new/?image={windows.pk}")
    expect(page.locator("#duration-limit")).to_contain_text("At most 1 h (rule 'windows short')")
    page.select_option("#id_image", str(image.pk))  # the durations follow the image's limit
    expect(page.locator("#duration-limit")).to_contain_text("At most 8 h (the site default)")
    expect(page.locator("#id_duration option")).to_have_count(8)
    expect(page.locator("#fit [data-fit=no]")).to_contain_text("lack memory")
    expect(page.locator("#id_start")).to_be_hidden()  # "now" is chosen
    page.click("button.use-earliest")
    expect(page.locator("#id_start")).to_be_visible()
    expect(page.locator("#fit [data-fit=yes]")).to_contain_text("Fits: a host has room")
    assert page.is_checked("input[name=when][value=later]") and page.input_value("#id_start")
    shot(page, "reserve-earliest")


def test_the_start_field_shows_only_while_later_is_chosen(lab, alice, asgi_server, login, page):
    _, image = lab
    login("alice", "alice-pass-1")
    page.goto(f"/reservations/new/?image={image.pk}")
    assert page.is_checked("input[name=when][value=now]")
    expect(page.locator("#id_start")).to_be_hidden()
    expect(page.get_by_text("Start (for later)")).to_be_hidden()
    page.check("input[name=when][value=later]")
    expect(page.locator("#id_start")).to_be_visible()
    page.check("input[name=when][value=now]")
    expect(page.locator("#id_start")).to_be_hidden()
    page.check("input[name=when][value=later]")  # a later start without a time: the form keeps "later" open
    page.click("#reserve-submit")
    expect(page.locator("#error-start")).to_have_text("give a start, or choose now")
    expect(page.locator("#id_start")).to_be_visible()
