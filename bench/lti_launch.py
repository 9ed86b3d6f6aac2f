"""LMS launch time: from the LMS's course link to vclmgr's course page answering 200.

    python bench/lti_launch.py [--launches 20]

Starts the test LMS (``tests/lti_platform.py``: its own key, JWKS, OIDC auth endpoint) and one
daphne on loopback over a fresh SQLite database, registers the LMS in vclmgr, and times each
launch as a browser makes it, with ``requests``: the course link in the LMS (the third-party
login initiation) → vclmgr's login URL → the LMS's auth endpoint (its page with the signed
id_token) → that form POSTed to ``/lti/launch/`` → the redirect → the course page, 200. Each
launch is a new browser (no cookies). ``--launches`` learners launch once each (their first
launch: the account is made, the course joined), then each launches again (returning). Prints
the median and p95 of each, in milliseconds. Target: p95 under 1 s.
"""

import argparse
import html
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, free_port, percentile, setup_django, start_daphne  # bench/ is on the script's path

TARGET = 1.0
CONTEXT = "bench-101"


def setup(path):
    """In a child whose environment selects the database: migrate and register the LMS."""
    setup_django()
    from django.core.management import call_command

    from lti import services

    call_command("migrate", verbosity=0)
    services.add_platform(actor="bench", **json.loads(Path(path).read_text()))


def launch(platform, user):
    """One launch in a new browser; its seconds, or exit naming the step that failed."""
    import requests

    browser = requests.Session()
    began = time.perf_counter()
    # The LMS's link → vclmgr's login initiation → the LMS's auth endpoint: redirects, followed.
    page = browser.get(f"{platform.url}/start", params={"user": user, "context": CONTEXT}, timeout=30)
    form = re.search(r'<form method="post" action="([^"]+)"', page.text)
    if page.status_code != 200 or form is None:
        raise SystemExit(f"launch of {user}: no auth form ({page.status_code}): {page.text[:500]}")
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
    # The page's onload submits the form: the id_token POSTed to /lti/launch/, its redirect followed.
    course = browser.post(
        html.unescape(form.group(1)), data={k: html.unescape(v) for k, v in fields.items()}, timeout=30
    )
    seconds = time.perf_counter() - began
    if course.status_code != 200 or not re.search(r"/classes/\d+/$", course.url):
        raise SystemExit(f"launch of {user}: ended at {course.url} ({course.status_code}): {course.text[:500]}")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()  # run_all.py passes every benchmark the same arguments
    if args.setup:
        return setup(args.setup)
    sys.path.insert(0, str(ROOT))
    from tests import lti_platform

    platform = lti_platform.Platform()
    learners = [f"learner{n:03d}" for n in range(args.launches)]
    for name in learners:
        platform.users[name] = lti_platform.person(f"sub-{name}", f"{name}@uni.example", name.title(), "Bench")
    platform.contexts[CONTEXT] = {"title": "Bench 101", "roles": {n: [lti_platform.LEARNER] for n in learners}}
    proc = log = None
    try:
        with tempfile.TemporaryDirectory(prefix="vclmgr-bench-lti-") as tmp:
            port = free_port()
            platform.tool_base = f"http://127.0.0.1:{port}"
            platform.tool_jwks = f"{platform.tool_base}/lti/jwks/"
            env = {
                **os.environ,
                "DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3",
                "VCLMGR_VAR_DIR": tmp,
                "DEBUG": "1",  # plain HTTP on loopback: cookies without Secure
                "REDIS_URL": "",
                "DJANGO_SETTINGS_MODULE": "vclmgr.settings",
                "LOG_LEVEL": "WARNING",
                "VCLMGR_OUTBOUND_ALLOW": "127.0.0.1",  # the LMS's key set is on loopback
            }
            registration = Path(tmp) / "platform.json"
            registration.write_text(json.dumps(platform.registration(name="Bench LMS")))
            subprocess.run([sys.executable, __file__, "--setup", str(registration)], cwd=ROOT, env=env, check=True)
            log = open(Path(tmp) / "web.log", "wb")  # noqa: SIM115 (closed below, after the server)
            proc = start_daphne(port, log, env)
            launch(platform, learners[0])  # warm-up: the server's first request imports the views
            first = [launch(platform, name) for name in learners[1:]]
            again = [launch(platform, name) for name in learners]
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
            proc = None
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        if log is not None:
            log.close()
        platform.stop()
    results = []
    for label, times in (("first launch", first), ("returning", again)):
        ms = [t * 1000 for t in times]
        result = {
            "launch": label,
            "launches": len(ms),
            "median_ms": round(percentile(ms, 0.5), 1),
            "p95_ms": round(percentile(ms, 0.95), 1),
            "max_ms": round(max(ms), 1),
            "target_met": percentile(times, 0.95) < TARGET,
        }
        results.append(result)
        print(json.dumps(result), flush=True)
    if not all(r["target_met"] for r in results):
        sys.exit("target missed")


if __name__ == "__main__":
    main()
