"""How long a reservation's build job waits in the queue, one reservation after another on ONE sim host.

    python bench/cold_path.py [--runs 20] [--workers 2] [--delay 0.3] [--brokers orm,redis] [--trace]

For each broker (django-q2's ORM broker on SQLite, the default install; Redis with SQLite)
it starts a fresh database, one sim host whose driver calls each take ``--delay`` seconds
(what a real host's define, start and destroy cost, roughly), one image, and a qcluster with
``--workers`` worker processes, then reserves through ``reservations.services.reserve`` (what
the API's POST calls) and reads the queue wait of the reservation's ``vm.create`` (job
received → started) in three cases, ``--runs`` each:
  * lone: the workers idle for a second before the reservation;
  * after end: the previous reservation on the host ended (its teardown and finish done);
  * during teardown: reserved as soon as ``end`` of the previous one returned, while its
    ``vm.destroy`` still runs on the same host.
p50 and p90 of each, and of reserve → ready. Target: a build starts within 0.2 s of its
reservation when a worker is free, in every case. ``--trace`` prints, for each build that
waited longer, the jobs and log lines of the seconds around it (the last ones, to stderr).
"""

import argparse
import base64
import json
import os
import sys
import tempfile
import time
from datetime import timedelta

from _common import (  # bench/ is on the script's path
    child_env,
    percentile,
    run_child,
    setup_django,
    start_qcluster,
    wait_for,
)

CASES = ("lone", "after_end", "during_teardown")
TARGET = 0.2  # seconds from the reservation to its build's start


def one(args):
    """Runs in a child process whose environment selects the database and broker."""
    setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django_q.brokers import get_broker

    get_broker().purge_queue()
    user, image = setup(args)
    worker = start_qcluster(args.workers)
    try:
        from monitoring.health import live_worker_count

        wait_for(lambda: live_worker_count() >= args.workers, 60, "the workers")
        end(reserve(user, image))  # stages the image on the host: not what is measured
        result = {"broker": args.label}
        for case in CASES:
            result[case] = measure(case, user, image, args.runs, args.trace)
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()
    print(json.dumps(result), flush=True)


def setup(args):
    from django.contrib.auth import get_user_model

    from inventory import services as inventory
    from provisioning import services

    inventory.create_hypervisor(
        actor="bench",
        name="sim00",
        address="10.77.0.1",
        driver="sim",
        cpus=16,
        memory_mib=16384,
        disk_gib=200,
        driver_options={"delay": args.delay} if args.delay else {},
    )
    image = services.create_image(
        actor="bench", name="bench-linux", os="Linux", min_memory_mib=256, default_vcpus=1, default_disk_gib=5
    )
    services.add_variant(
        image, actor="bench", hypervisor_type="sim", format="sim", location="sim://library/bench-linux"
    )
    user = get_user_model().objects.create_user("bench-user", password=os.urandom(8).hex(), is_staff=True)
    return user, image


def reserve(user, image):
    from reservations import services as reservations
    from reservations.models import Reservation

    reservation = reservations.reserve(user, image, actor=user, duration=timedelta(hours=1))

    def ready():
        status = Reservation.objects.values_list("status", flat=True).get(pk=reservation.pk)
        if status in ("failed", "ended"):
            raise SystemExit(f"reservation {reservation.pk} {status}")
        return status == "ready"

    wait_for(ready, 60, f"reservation {reservation.pk}")
    return Reservation.objects.get(pk=reservation.pk)


def end(reservation, wait=True):
    from reservations import services as reservations
    from reservations.models import Reservation

    reservations.end(reservation, actor="bench")
    if wait:
        wait_for(lambda: Reservation.objects.get(pk=reservation.pk).status == "ended", 60, "the end")


def measure(case, user, image, runs, trace=False):
    from jobs.models import Job
    from reservations.models import Reservation

    waits, readies = [], []
    previous = None
    for _ in range(runs):
        if case == "lone":
            time.sleep(1.0)
        t0 = time.monotonic()
        reservation = reserve(user, image)
        readies.append(time.monotonic() - t0)
        job = Job.objects.filter(opcode="vm.create", params__vm=reservation.vm_id).get()
        waits.append((job.started - job.received).total_seconds())
        if trace and waits[-1] > TARGET:
            print_trace(job)
        previous = reservation
        # during_teardown: the next reservation comes while this one's teardown runs
        end(previous, wait=case != "during_teardown")
    if case == "during_teardown":
        wait_for(lambda: Reservation.objects.get(pk=previous.pk).status == "ended", 60, "the last end")
    return {
        "queue_p50": round(percentile(waits, 0.5), 3),
        "queue_p90": round(percentile(waits, 0.9), 3),
        "queue_max": round(max(waits), 3),
        "ready_p50": round(percentile(readies, 0.5), 3),
        "ready_p90": round(percentile(readies, 0.9), 3),
    }


def print_trace(job):
    """The jobs and log lines around a build that waited past the target (``--trace``)."""
    from jobs.models import Job, JobLog

    t0 = job.received
    print(f"--- vm.create {job.pk} waited {(job.started - t0).total_seconds():.3f}", file=sys.stderr)
    for other in Job.objects.filter(received__gte=t0 - timedelta(seconds=5)).order_by("pk"):
        ended = (other.ended - t0).total_seconds() if other.ended else None
        started = (other.started - t0).total_seconds() if other.started else None
        print(
            f"  job {other.pk} {other.opcode} recv {(other.received - t0).total_seconds():.3f} "
            f"start {started} end {ended} {other.status} {other.runner}",
            file=sys.stderr,
        )
    for line in JobLog.objects.filter(time__gte=t0 - timedelta(seconds=5)).order_by("pk"):
        print(f"    {(line.time - t0).total_seconds():.3f} job {line.job_id}: {line.message[:100]}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--delay", type=float, default=0.3, help="seconds each sim driver call takes")
    parser.add_argument("--brokers", default="orm,redis")
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--trace", action="store_true", help="show the jobs around each build that waited > 0.2 s")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args)
        return
    results = []
    for label in args.brokers.split(","):
        with tempfile.TemporaryDirectory(prefix="vclmgr-bench-") as var:
            env = child_env(var, label, **({"REDIS_URL": args.redis} if label == "redis" else {}))
            env["CREDENTIAL_KEY"] = base64.urlsafe_b64encode(os.urandom(32)).decode()  # reservations' logins
            command = [sys.executable, __file__, "--one", label, "--label", label]
            command += ["--runs", str(args.runs), "--workers", str(args.workers), "--delay", str(args.delay)]
            command += ["--trace"] if args.trace else []
            print(f"running {label} … (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
            results.append(run_child(command, env, label, timeout=1800, echo_stderr=args.trace))
    print(
        f"{args.runs} reservations per case, one after another on one sim host (driver calls {args.delay} s), "
        f"{args.workers} worker processes; load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'broker':<8} {'case':<16} {'queue p50':>10} {'queue p90':>10} {'queue max':>10} {'ready p50':>10}")
    for row in results:
        for case in CASES:
            got = row[case]
            print(
                f"{row['broker']:<8} {case:<16} {got['queue_p50']:>10.3f} {got['queue_p90']:>10.3f} "
                f"{got['queue_max']:>10.3f} {got['ready_p50']:>10.3f}"
            )


if __name__ == "__main__":
    main()
