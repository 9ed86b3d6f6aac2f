"""Regenerate docs/screenshot.png: serve the demo, log in as the demo admin, capture a page.

Run: ``DEBUG=1 .venv/bin/python tools/screenshot.py [PATH] [OUT]`` (default: the admin dashboard,
into docs/screenshot.png). For ``/reservations/usage/`` the demo also gets 30 days of synthetic
history, stored per day (``docs/screenshots/usage.png``). ``template`` as PATH: the page of an image
whose template is running and which has a testing revision beside production: its Template card
into OUT and its Revisions card beside it (``class-image-template.png``, ``…-revisions.png``).
Uses a throwaway var directory, Debian's Chromium and a free port. Before serving, ``SCENE``
gives the demo cluster something to show: reservations now and in the next days, some load
on the hosts, a drained and an offline host.
"""

import os
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
from reservations import demo, usage
demo.usage_history(30, 40)
usage.backfill(timezone.now().date() - timedelta(days=30), timezone.now().date())
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
            page = browser.new_page(viewport={"width": 1280, "height": 1080}, base_url=f"http://127.0.0.1:{port}")
            page.goto("/login/")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", password)
            page.click("button[type=submit]")
            page.wait_for_url("**/")
            page.goto(path)
            page.wait_for_timeout(4000)  # the reservations made by SCENE come up meanwhile
            (ROOT / out).parent.mkdir(parents=True, exist_ok=True)
            if template:
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
