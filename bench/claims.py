"""Reservation burst: many users reserving the same window at once, over two web processes.

    python bench/claims.py [--requests 200] [--users 100] [--room 50] [--postgres URL]

For SQLite (always) and PostgreSQL (with ``--postgres postgres://user@host:port/NAME``; the
database NAME is dropped and created afresh), it migrates a fresh database, makes hosts with
room for exactly ``--room`` VMs of the image over the window, ``--users`` users with API
tokens, starts two daphne processes on loopback, and sends ``--requests`` ``POST
/api/v1/reservations/`` at once (each user ``requests / users`` times, alternating servers)
for one future window. It reports how many were accepted, refused (400) and failed (5xx),
the "deadlock detected" lines in the servers' logs, and the latency p50 / p99 / max.
Targets: exactly ``--room`` accepted, 0 deadlocks, 0 5xx.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from _common import ROOT, free_port, percentile, setup_django, start_daphne  # bench/ is on the script's path

HOST_VCPUS = 10  # the image takes 1 vCPU: each host has room for 10 VMs


def setup(args):
    """Runs in a child process whose environment selects the database: writes tokens and the body."""
    setup_django()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.utils import timezone

    from accounts import tokens
    from inventory import services as inventory
    from tests.images import small_image

    call_command("migrate", verbosity=0)
    for n in range(args.room // HOST_VCPUS):
        inventory.create_hypervisor(
            actor="bench",
            name=f"bench{n}",
            address=f"10.9.0.{n + 1}",
            driver="sim",
            cpus=HOST_VCPUS,
            cpu_ratio=1.0,
            memory_mib=262144,
            disk_gib=5000,
        )
    image = small_image("bench", "sim://bench", actor="bench")
    users = get_user_model().objects
    clear = [
        tokens.issue(users.create_user(f"user{n:03d}", password=None), "bench", scopes="all")[1]
        for n in range(args.users)
    ]
    start = (timezone.now() + timedelta(hours=2)).replace(second=0, microsecond=0)
    body = {"image": image.pk, "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    Path(args.setup).write_text(json.dumps({"tokens": clear, "body": body}))


def start_web(env, log_path):
    port = free_port()
    log = open(log_path, "wb")  # noqa: SIM115 (closed by the caller's stop)
    return start_daphne(port, log, env), log, f"http://127.0.0.1:{port}"


def post(url, token, body):
    request = urllib.request.Request(
        f"{url}/api/v1/reservations/",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 (loopback)
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError):
        status = 0  # no answer at all
    return status, time.monotonic() - began


def burst(urls, tokens, body, count):
    answers = [None] * count
    gate = threading.Barrier(count)

    def send(i):
        gate.wait()
        answers[i] = post(urls[i % len(urls)], tokens[i % len(tokens)], body)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def run_leg(label, database_url, args):
    with tempfile.TemporaryDirectory(prefix="vclmgr-bench-claims-") as tmp:
        if database_url is None:
            database_url = f"sqlite:///{tmp}/bench.sqlite3"
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "VCLMGR_VAR_DIR": tmp,
            "DEBUG": "1",
            "REDIS_URL": "",
            "DJANGO_SETTINGS_MODULE": "vclmgr.settings",
            "LOG_LEVEL": "WARNING",
        }
        data = Path(tmp) / "setup.json"
        subprocess.run(
            [sys.executable, __file__, "--setup", str(data), "--users", str(args.users), "--room", str(args.room)],
            cwd=ROOT,
            env=env,
            check=True,
        )
        prepared = json.loads(data.read_text())
        webs = [start_web(env, Path(tmp) / f"web{n}.log") for n in range(2)]
        try:
            began = time.monotonic()
            answers = burst([url for _, _, url in webs], prepared["tokens"], prepared["body"], args.requests)
            wall = time.monotonic() - began
        finally:
            for proc, log, _ in webs:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
                log.close()
        logs = "".join((Path(tmp) / f"web{n}.log").read_text(errors="replace") for n in range(2))
    statuses = [status for status, _ in answers]
    latencies = [seconds for _, seconds in answers]
    return {
        "database": label,
        "requests": args.requests,
        "accepted": statuses.count(201) + statuses.count(202),
        "refused_400": statuses.count(400),
        "other_4xx": sum(1 for s in statuses if 400 < s < 500),
        "5xx": sum(1 for s in statuses if s >= 500),
        "no_answer": statuses.count(0),
        "deadlocks_logged": logs.count("deadlock detected"),
        "p50_s": round(percentile(latencies, 0.5), 3),
        "p99_s": round(percentile(latencies, 0.99), 3),
        "max_s": round(max(latencies), 3),
        "wall_s": round(wall, 2),
        "target_met": statuses.count(201) + statuses.count(202) == args.room
        and all(s < 500 and s != 0 for s in statuses)
        and "deadlock detected" not in logs,
    }


def fresh_postgres(url):
    """Drop and create the database the URL names (a benchmark's own database)."""
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return url


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--room", type=int, default=50, help=f"VMs that fit (a multiple of {HOST_VCPUS})")
    parser.add_argument("--postgres", help="postgres://user@host:port/NAME: also run on this (fresh) database")
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()  # run_all.py passes every benchmark the same arguments
    if args.setup:
        return setup(args)
    legs = [("sqlite", None)] + ([("postgresql", fresh_postgres(args.postgres))] if args.postgres else [])
    results = [run_leg(label, url, args) for label, url in legs]
    for result in results:
        print(json.dumps(result), flush=True)
    if not all(result["target_met"] for result in results):
        sys.exit("target missed")


if __name__ == "__main__":
    main()
