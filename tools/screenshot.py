"""Regenerate docs/screenshot.png: serve the demo, log in as the demo admin, capture a page.

Run: ``DEBUG=1 .venv/bin/python tools/screenshot.py [PATH]`` (default: the blade center page).
Uses a throwaway var directory, Debian's Chromium and a free port.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(path="/inventory/blade-centers/1/"):
    var = tempfile.mkdtemp(prefix="vclmgr-shot-")
    env = {**os.environ, "DEBUG": "1", "VCLMGR_VAR_DIR": var, "DATABASE_URL": "", "REDIS_URL": ""}
    run = [sys.executable, "manage.py"]
    subprocess.run([*run, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run([*run, "demo"], cwd=ROOT, env=env, check=True, capture_output=True)
    password = dict(line.split(":", 1) for line in (Path(var) / "demo_credentials.txt").read_text().split())["admin"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([*run, "serve", "--port", str(port), "--workers", "1"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if time.monotonic() > deadline or server.poll() is not None:
                sys.exit("the demo server did not start")
            time.sleep(0.5)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 760}, base_url=f"http://127.0.0.1:{port}")
            page.goto("/login/")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", password)
            page.click("button[type=submit]")
            page.wait_for_url("**/")
            page.goto(path)
            page.wait_for_timeout(1500)
            (ROOT / "docs").mkdir(exist_ok=True)
            page.screenshot(path=str(ROOT / "docs" / "screenshot.png"))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main(*sys.argv[1:])
