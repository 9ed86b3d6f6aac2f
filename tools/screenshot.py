"""Regenerate docs/screenshot.png: serve the demo, log in as the demo admin, capture a page.

Run: ``DEBUG=1 .venv/bin/python tools/screenshot.py [PATH] [OUT]`` (default: the admin dashboard,
into docs/screenshot.png). For ``/reservations/usage/`` the demo also gets 30 days of synthetic
history, stored per day (``docs/screenshots/usage.png``). ``template`` as PATH: the page of an image
whose template is running and which has a testing revision beside production: its Template card
into OUT and its Revisions card beside it (``class-image-template.png``, ``…-revisions.png``).
``course`` as PATH: a course with an instructor, three students and a weekly class with an hours
budget (``COURSE_SCENE``); its page as the instructor sees it (the class, its next sessions, the
budget table) into OUT (``course-instructor.png``), the new-class form filled in beside it
(``course-new-class.png``) and the student's view (next session, seat, hours left) beside it
(``course-student.png``), both names made from OUT's with ``instructor`` replaced.
``environment`` as PATH: an environment of three machines reserved now (of an image that reverts
on end: each keeps a clean snapshot); once every machine is ready one of them is suspended, so
that its page offers Suspend all, Resume all and Revert all; that page into OUT
(``environment.png``).
Uses a throwaway var directory, Debian's Chromium and a free port. Before serving, ``SCENE``
gives the demo cluster something to show: reservations now and in the next days, some load
on the hosts, a drained and an offline host.
"""

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCENE = """
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from inventory import services as inventory
from inventory.models import Hypervisor
from capacity import services as capacity
from provisioning.models import Image
from reservations import services as reservations

now = timezone.now()
desktop = Image.objects.get(name="ubuntu-24.04-desktop")
for user in get_user_model().objects.filter(username__in=["admin", "demo"]):
    reservations.reserve(user, desktop, actor=user, duration=timedelta(hours=3))
    reservations.reserve(user, desktop, actor=user, start=now + timedelta(hours=20), duration=timedelta(hours=4))
    reservations.reserve(user, desktop, actor=user, start=now + timedelta(hours=44), duration=timedelta(hours=3))
hosts = list(Hypervisor.objects.filter(blade_center__isnull=False).order_by("slot"))
for i, host in enumerate(hosts):  # some load, unevenly spread
    share = (i * 37 % 90) / 100
    if share:
        demand = capacity.Demand(host.cpus * 4 * share, host.memory_mib * share, host.disk_gib * share / 2,
                                 start=now, purpose="demo load")
        capacity.claim_on_host(host, demand, actor="demo")
inventory.set_state(hosts[5], "drained", "demo: firmware update", actor="demo")
inventory.set_state(hosts[12], "offline", "demo: power supply failed", actor="demo")
"""

USAGE_SCENE = """
from datetime import timedelta
from django.utils import timezone
from reservations import demo, rollup
demo.usage_history(30, 40)
rollup.backfill(timezone.now().date() - timedelta(days=30), timezone.now().date())
"""

TEMPLATE_SCENE = """
from django.contrib.auth import get_user_model
from provisioning import services as vms
from provisioning.models import Image
from reservations import templates

admin = get_user_model().objects.get(username="admin")
image = Image.objects.get(name="ubuntu-24.04-desktop")
variant = image.variants.first()
vms.add_revision(image, actor=admin, comment="MATLAB R2026b installed", variants=[
    {"hypervisor_type": variant.hypervisor_type, "format": variant.format,
     "location": variant.location + "-r2", "size_gib": variant.size_gib}])
templates.start_template(image, actor=admin)
print(image.pk)
"""

# Names and values of the course the user guide shows; the class's next session is tomorrow, so
# its seats are claimed (within the look-ahead) and pending (its lead time not yet come).
COURSE_SCENE = """
from datetime import time, timedelta
from decimal import Decimal
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone
from accounts import access, preferences
from classes import budget, calendar, services as classes
from provisioning.models import Image
from reservations import services as reservations

users = get_user_model().objects
course = Group.objects.create(name="Networks 101")
people = {}
for name in ("ines", "leo", "mia", "noah"):
    people[name] = users.create_user(name, email=f"{name}@uni.example", password=PASSWORD)
    preferences.set_time_zone(people[name], "Europe/Berlin", actor=people[name])
    course.user_set.add(people[name])
ines = people["ines"]
access.set_roles(ines, ["instructor"], actor="demo")
desktop = Image.objects.get(name="ubuntu-24.04-desktop")
today = timezone.localdate()
tomorrow = today + timedelta(days=1)
klass = classes.create_class(
    actor=ines, by=ines, course=course, name="Routing lab", image=desktop,
    first_day=today - timedelta(days=21), last_day=today + timedelta(days=90), time_zone="Europe/Berlin",
    sessions=[calendar.Session(tomorrow.weekday(), time(10), 90),
              calendar.Session((tomorrow.weekday() + 3) % 7, time(14), 120)],
    exceptions=[(tomorrow + timedelta(days=14), "Reading week")], hours_budget=Decimal(10), lead_minutes=30,
)
reservations.reserve(people["leo"], desktop, actor=people["leo"], duration=timedelta(hours=2))
reservations.reserve(people["mia"], desktop, actor=people["mia"], duration=timedelta(hours=3))
budget.grant_hours(klass, people["mia"], Decimal(5), "term project", actor=ines, by=ines)
print(course.pk)
"""


# An environment of three machines on two networks, reserved now by the demo admin: its page shows
# every machine live (``environment`` as PATH: the page's Machines card into OUT).
ENVIRONMENT_SCENE = """
from datetime import timedelta
from django.contrib.auth import get_user_model
from environments import services as environments
from provisioning.models import Image
from reservations import services as reservations

admin = get_user_model().objects.get(username="admin")
from provisioning import services as vms

debian = vms.update_image(Image.objects.get(name="debian-12"), actor="demo", revert_on_end=True)
small = {"vcpus": 1, "memory_mib": 1024, "disk_gib": 10}
lab = environments.create_template(
    actor=admin, name="routing-lab", description="A router between two client networks.",
    members=[{"name": "router", "image": debian, "networks": ["left", "right"], "entry": True, **small},
             {"name": "client-a", "image": debian, "networks": ["left"], **small},
             {"name": "client-b", "image": debian, "networks": ["right"], **small}],
    networks=[{"name": "left", "cidr": "192.168.10.0/24"}, {"name": "right", "cidr": "192.168.20.0/24"}],
)
head = reservations.reserve_environment(admin, lab, actor=admin, duration=timedelta(hours=2))
print(head.pk)
"""

# One machine of that environment suspended (its job run by serve's worker): the page then offers
# every verb (Suspend all for the running ones, Resume all for it, Revert all to the clean state).
ENVIRONMENT_SUSPEND = """
from provisioning import services as vms
from provisioning.models import VM
from reservations.models import Reservation

head = Reservation.objects.get(pk=HEAD)
vm = Reservation.objects.get(head=head, hostname="client-b").vm
vms.submit_action(vm, "suspend", actor=head.user, reason="demo: one machine suspended")
"""


def log_in(page, username, password):
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/")


def course_shots(browser, base_url, path, out, password):
    """The course page as its instructor and as a student sees it, and the new-class form filled in."""
    for who, name in (("instructor", "ines"), ("student", "leo")):
        page = browser.new_page(viewport={"width": 1100, "height": 900}, base_url=base_url, timezone_id="Europe/Berlin")
        log_in(page, name, password)
        page.goto(path)
        page.locator("#course-classes").screenshot(path=out.replace("instructor", who))
        if who == "instructor":
            form = page.locator("#new-class")
            form.locator("[name=name]").fill("Security lab")
            form.locator("[name=image]").select_option(label="ubuntu-24.04-desktop")
            form.locator("[name=first_day]").fill("2027-02-15")
            form.locator("[name=last_day]").fill("2027-06-04")
            form.locator("[name=sessions]").fill("Mon 10:00 90\nThu 14:00 120")
            form.locator("[name=exceptions]").fill("2027-04-05 Easter Monday")
            form.locator("[name=hours_budget]").fill("10")
            form.screenshot(path=out.replace("instructor", "new-class"))
        page.close()


def environment_shot(page, path, shell, env, out):
    """The environment's page once every machine is ready and one of them is suspended."""
    for _ in range(30):  # its machines are built by serve's worker
        if page.locator("#reservation-status.res-ready").count():
            break
        page.wait_for_timeout(1000)
    head = path.strip("/").split("/")[-1]
    subprocess.run([*shell, ENVIRONMENT_SUSPEND.replace("HEAD", head)], cwd=ROOT, env=env, check=True)
    for _ in range(30):
        page.reload()
        if page.locator("#resume-all").count() and page.locator("#revert-all").count():
            break
        page.wait_for_timeout(1000)
    page.locator("#reservation-panel").screenshot(path=out)


def main(path="/", out="docs/screenshot.png"):
    var = tempfile.mkdtemp(prefix="vclmgr-shot-")
    env = {**os.environ, "DEBUG": "1", "VCLMGR_VAR_DIR": var, "DATABASE_URL": "", "REDIS_URL": ""}
    run = [sys.executable, "manage.py"]
    subprocess.run([*run, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run([*run, "demo"], cwd=ROOT, env=env, check=True, capture_output=True)
    subprocess.run([*run, "shell", "-c", SCENE], cwd=ROOT, env=env, check=True)
    if path.startswith("/reservations/usage/"):
        subprocess.run([*run, "shell", "-c", USAGE_SCENE], cwd=ROOT, env=env, check=True)
    template = path == "template"
    if template:
        scene = subprocess.run(
            [*run, "shell", "-c", TEMPLATE_SCENE], cwd=ROOT, env=env, check=True, capture_output=True
        )
        path = f"/vms/images/{scene.stdout.split()[-1].decode()}/"
    course = path == "course"
    if course:
        course_password = secrets.token_urlsafe(16)
        scene = COURSE_SCENE.replace("PASSWORD", repr(course_password))
        done = subprocess.run([*run, "shell", "-c", scene], cwd=ROOT, env=env, check=True, capture_output=True)
        path = f"/classes/{done.stdout.split()[-1].decode()}/"
    environment = path == "environment"
    if environment:
        done = subprocess.run(
            [*run, "shell", "-c", ENVIRONMENT_SCENE], cwd=ROOT, env=env, check=True, capture_output=True
        )
        path = f"/reservations/{done.stdout.split()[-1].decode()}/"
    password = dict(line.split(":", 1) for line in (Path(var) / "demo_credentials.txt").read_text().split())["admin"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [*run, "serve", "--port", str(port), "--workers", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if time.monotonic() > deadline or server.poll() is not None:
                sys.exit("the demo server did not start")
            time.sleep(0.5)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            (ROOT / out).parent.mkdir(parents=True, exist_ok=True)
            if course:
                course_shots(browser, f"http://127.0.0.1:{port}", path, str(ROOT / out), course_password)
                browser.close()
                return
            page = browser.new_page(viewport={"width": 1280, "height": 1080}, base_url=f"http://127.0.0.1:{port}")
            log_in(page, "admin", password)
            page.goto(path)
            page.wait_for_timeout(4000)  # the reservations made by SCENE come up meanwhile
            if environment:
                environment_shot(page, path, [*run, "shell", "-c"], env, str(ROOT / out))
            elif template:
                for _ in range(30):  # the template's machine is built by serve's worker
                    if page.locator("#template .badge.ready").count():
                        break
                    page.wait_for_timeout(1000)
                    page.reload()
                page.locator("#revisions-card").screenshot(path=str(ROOT / out).replace(".png", "-revisions.png"))
                page.locator("#template").screenshot(path=str(ROOT / out))
            else:
                page.screenshot(path=str(ROOT / out), full_page=out != "docs/screenshot.png")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main(*sys.argv[1:])
