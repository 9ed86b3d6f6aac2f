"""A class session's seats warmed from the schedule, on simulated hosts, real worker processes.

    python bench/class_warm.py [--seats 300] [--hosts 10] [--workers 2] [--delay 0.1]
    python bench/class_warm.py --smoke      # 20 seats: does it still run?

A fresh SQLite database, ``--hosts`` sim hosts (each step of a VM's build and warm start takes
``--delay`` s on them), one image, one course, and a class of ``--seats`` seats whose one
session starts a few minutes from now (real time). Its lead time is 2 minutes and
``CLASS_WARM_MINUTES`` 3: warm VMs for every seat from 5 minutes before the start, the seats
built 2 minutes before it (``RESERVATION_LEAD_MINUTES`` 2 too): the site's 15 and 15, shortened.
Nothing is driven by the bench: a real qcluster's workers run the classes planner and the warm
pools' round every 5 s (``CLASS_PLAN_SECONDS``, ``WARM_POOL_SECONDS``), as a site would. The
bench waits until the start (plus a little) and reads back:

- seats ready at start: seats whose ``ready`` came at or before the session's start (target:
  all of them);
- taken warm: seats that took a warm VM (the rest booted cold);
- warm VMs made before the seats' build (their ``vm.warm`` job ended before the seats' lead time);
- build → ready: a seat's ``provisioning`` to its ``ready``, p50 and p90, warm and cold apart;
- the last seat's ready, in seconds before the start.
"""

import argparse
import base64
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

# (bench/ is on the script's path)
from _common import ROOT, child_env, percentile, run_child, setup_django, sim_hosts, start_qcluster

LEAD_MINUTES = 2
WARM_MINUTES = 3


def one(args):
    setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django_q.brokers import get_broker

    get_broker().purge_queue()
    meeting = setup(args)
    start = meeting.start
    print(f"session at {start:%H:%M:%S} UTC, {args.seats} seats", file=sys.stderr, flush=True)
    worker = start_qcluster(args.workers)
    try:
        wait_until(start + timedelta(seconds=20))
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()
    print(json_result(report(meeting, args)), flush=True)


def wait_until(moment):
    while datetime.now(UTC) < moment:
        time.sleep(1)


def setup(args):
    """Hosts with room for every seat and its warm VM, the image, the course, the class."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from classes import calendar
    from classes import services as classes
    from jobs import services as jobs
    from provisioning import services

    per_host = -(-args.seats // args.hosts) + 1
    sim_hosts(args.hosts, per_host)
    image = services.create_image(
        actor="bench", name="lab-linux", os="Linux", min_memory_mib=256, default_memory_mib=512, default_disk_gib=5
    )
    image = services.update_image(image, actor="bench", default_vcpus=1)
    services.add_variant(image, actor="bench", hypervisor_type="sim", format="sim", location="sim://library/lab-linux")
    jobs.set_queue_settings(actor="bench", limit=max(8, args.workers * 4))
    course = Group.objects.create(name="lab-course")
    teacher = get_user_model().objects.create_user("teacher", password=os.urandom(8).hex(), is_staff=True)
    course.user_set.add(teacher)
    # The first whole minute at least lead + warm + 1 minute from now: the warm time is still ahead.
    now = datetime.now(UTC)
    start = (now + timedelta(minutes=LEAD_MINUTES + WARM_MINUTES + 1, seconds=59)).replace(second=0, microsecond=0)
    session = calendar.Session(start.weekday(), start.time(), 60)
    klass = classes.create_class(
        actor="bench",
        course=course,
        name="Lab",
        image=image,
        first_day=start.date(),
        last_day=start.date(),
        sessions=[session],
        seats=args.seats,
        lead_minutes=LEAD_MINUTES,
        time_zone="UTC",
    )
    return klass.meetings.get()


def report(meeting, args):
    from jobs.models import Job
    from reservations.models import Reservation, ReservationHistory

    seats = Reservation.objects.filter(block=meeting.block).select_related("vm")
    ready, build = {}, {}
    trail = ReservationHistory.objects.filter(reservation__block=meeting.block)
    for pk, status, at in trail.values_list("reservation", "status", "at"):
        if status in ("ready", "provisioning"):
            (ready if status == "ready" else build).setdefault(pk, at)
    warm = {s.pk for s in seats if s.vm is not None and s.vm.warm == "hit"}
    built_at = meeting.start - timedelta(minutes=LEAD_MINUTES)
    made = Job.objects.filter(opcode="vm.warm", status=Job.Status.SUCCESS)
    early = made.filter(ended__lte=built_at).count()
    took = {"warm": [], "cold": []}
    for pk in ready.keys() & build.keys():
        took["warm" if pk in warm else "cold"].append((ready[pk] - build[pk]).total_seconds())
    last = max(ready.values()) if ready else None
    return {
        "seats": args.seats,
        "ready_at_start": sum(1 for at in ready.values() if at <= meeting.start),
        "taken_warm": len(warm),
        "warm_vms_made_before_build": early,
        "warm_vms_made": made.count(),
        "build_to_ready_warm_p50_s": round(percentile(took["warm"], 0.5), 2),
        "build_to_ready_warm_p90_s": round(percentile(took["warm"], 0.9), 2),
        "build_to_ready_cold_p50_s": round(percentile(took["cold"], 0.5), 2),
        "last_ready_before_start_s": round((meeting.start - last).total_seconds(), 1) if last else None,
    }


def json_result(result):
    import json

    return json.dumps(result)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seats", type=int, default=300)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds each sim step takes")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.seats, args.hosts = 20, 2
    if args.one:
        return one(args)
    var = tempfile.mkdtemp(prefix="vclmgr-bench-class-")
    env = child_env(
        var,
        "class",
        CLASS_MAX_SEATS=str(max(args.seats, 1)),
        CLASS_PLAN_SECONDS="5",
        WARM_POOL_SECONDS="5",
        CLASS_WARM_MINUTES=str(WARM_MINUTES),
        RESERVATION_LEAD_MINUTES=str(LEAD_MINUTES),  # (the clock builds a seat no earlier than the planner)
        CREDENTIAL_KEY=base64.urlsafe_b64encode(os.urandom(32)).decode(),  # the seats' logins
        VCLMGR_SIM_OPTIONS=f'{{"delay": {args.delay}}}',
    )
    command = [sys.executable, str(Path(__file__).resolve()), "--one", *sys.argv[1:]]
    result = run_child(command, env, "class_warm", timeout=900, echo_stderr=True)
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if result["ready_at_start"] < result["seats"]:
        sys.exit(f"{result['seats'] - result['ready_at_start']} seats were not ready at the start")


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
