"""SQL statements per operation, counted (machine-independent): what each step of a reservation costs
the database, on the simulated driver, in one process (no worker, no broker round trips measured).

    python bench/statements.py [--postgres URL] [--repeat 10] [--detail]

Operations (each the mean over ``--repeat`` after one warm-up that stages the image on the host):
  * reservation accepted: ``reservations.services.reserve`` for now, as the page and API call it
    (quota, claim, row, change log, event, the build job's submission and its wake-up token);
  * VM created: the build job run by a worker (``tasks.run_next``: claim, ``vm.create``'s steps on
    the simulator, the reservation turning ready, the job's end);
  * run completed: a batch run of ``make test`` on the simulator, from ``runs.services.submit``
    to its end (its VM built, the command, its output and exit kept, the VM torn down);
  * event delivered: one event written (its INSERT; it joins the transaction of the change it
    describes) and read by an ASGI process's relay (one SELECT per poll, shared by its events).
Target: reservation accepted + VM created ≤ 60 statements on the sim driver. Counted:
every statement sent, and (in brackets) those without transaction control (BEGIN, COMMIT,
SAVEPOINT, RELEASE), which SQLite sends explicitly and PostgreSQL too.
``--detail`` prints the statements of one acceptance and one VM build, grouped by table and
kind, and by call site (the innermost vclmgr frame outside the database helpers).
``--postgres`` must name a disposable database: the bench empties it. On PostgreSQL the bulk
inserts without RETURNING of a lone table (``core.bulk.insert_rows``: a batch's events with no
change-log rows) go as ``COPY``, which Django's capture does not see: they are counted apart
(``bulk.copy_batch``) and printed below the figures, then added to the total.
"""

import argparse
import json
import os
import re
import traceback
from collections import Counter
from datetime import timedelta

from _django import ROOT, configure  # bench/ is the script's own folder, first on sys.path

TARGET = 60


def setup(repeat):
    from django.contrib.auth import get_user_model

    from drivers.sim.models import SimExecProfile
    from inventory import services as inventory
    from provisioning import services

    inventory.create_hypervisor(
        actor="bench",
        name="sim00",
        address="10.77.0.1",
        driver="sim",
        cpus=4 * (repeat + 2),
        memory_mib=1024 * (repeat + 2),
        disk_gib=10 * (repeat + 2),
    )
    image = services.create_image(
        actor="bench", name="bench-linux", os="Linux", min_memory_mib=256, default_memory_mib=512, default_disk_gib=5
    )
    services.add_variant(
        image, actor="bench", hypervisor_type="sim", format="sim", location="sim://library/bench-linux"
    )
    SimExecProfile.objects.create(image=image.name, output="ok\n", exit_status=0, seconds=0)
    users = [
        get_user_model().objects.create_user(f"student{n}", password=os.urandom(8).hex()) for n in range(repeat + 1)
    ]
    return image, users


def reserve(user, image):
    from reservations import services

    return services.reserve(user, image, actor=user, duration=timedelta(hours=1))


SITES = []  # (sql, call site) of the statements counted while --detail is on
COPIES = []  # tables written by COPY (PostgreSQL), which the capture does not see


def count_copies():
    """Note every COPY that ``core.bulk`` sends (``copy_batch``: its callers look it up by name)."""
    from core import bulk

    copy_batch = bulk.copy_batch

    def counting(cursor, table, columns, params):
        COPIES.append(table)
        return copy_batch(cursor, table, columns, params)

    bulk.copy_batch = counting


def _site():
    skip = ("/bench/", "/core/bulk.py", "/jobs/models.py", "/django/", "/.venv/")
    for frame in reversed(traceback.extract_stack()[:-3]):
        if frame.filename.startswith(str(ROOT)) and not any(part in frame.filename for part in skip):
            return f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno} {frame.name}"
    return "?"


def counted(fn, sites=False):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def note(execute, sql, params, many, context):
        SITES.append((sql, _site()))
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as queries:
        if sites:
            with connection.execute_wrapper(note):
                value = fn()
        else:
            value = fn()
    return value, [query["sql"] for query in queries.captured_queries]


CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")


def work(sql):
    """The statements that are not transaction control."""
    return [q for q in sql if not q.lstrip().upper().startswith(CONTROL)]


def build():
    """Run the build job (and what follows it) as a worker would."""
    from jobs import tasks

    tasks.run_next()


def run_one(user, image):
    """A batch run on the simulator, as ``manage.py run`` submits it, then its job to the end."""
    from jobs import tasks
    from runs import services
    from runs.models import Run

    run = services.submit(actor=user, owner=user, image=image, argv=["make", "test"])
    for _ in range(20):  # a run hands its VM's wait back to the queue at most a few times
        tasks.run_next()
        if Run.objects.get(pk=run.pk).is_final:
            break
    return run.pk


def must_have_run(run_id):
    from runs.models import Run

    run = Run.objects.get(pk=run_id)
    if run.state != "success":
        raise SystemExit(f"run {run_id} is {run.state}: {run.message}")


def must_be_ready(reservation_id):
    from reservations.models import Reservation

    status = Reservation.objects.get(pk=reservation_id).status
    if status != "ready":
        raise SystemExit(f"reservation {reservation_id} is {status}, not ready")


def deliver():
    from core import events, relay

    high_water = relay._max_id()
    _, written = counted(lambda: events.emit("bench.ping", {"n": 1}, ["admin"]))
    rows, read = counted(lambda: relay._rows_after(high_water, []))
    assert [row["kind"] for row in rows] == ["bench.ping"], rows
    return len(work(written)), len(read)


_TABLE = re.compile(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', re.I)


def kind_of(sql):
    verb = sql.split(None, 1)[0].upper()
    table = _TABLE.search(sql)
    return f"{verb} {table.group(1) if table else ''}".strip()


def measure(args):
    from jobs import wake

    count_copies()
    image, users = setup(args.repeat)
    # The wake-up tokens a submission enqueues are counted (the embedded broker is the database);
    # top_up's reading of the broker's size is a cache hit in steady state, so it is left as is.
    warm = reserve(users[0], image)
    build()  # the first VM on a host stages the image: not the common case
    must_be_ready(warm.pk)
    accepted, created, phases, copies = [], [], {}, {"accepted": 0, "created": 0, "run": 0}
    for user in users[1:]:
        first = not accepted and args.detail
        COPIES[:] = []
        reservation, sql = counted(lambda user=user: reserve(user, image), sites=first)
        accepted.append(sql)
        copies["accepted"] += len(COPIES)
        if first:
            phases["reservation accepted"], SITES[:] = list(SITES), []
        COPIES[:] = []
        _, sql = counted(build, sites=first)
        copies["created"] += len(COPIES)
        if first:
            phases["VM created"], SITES[:] = list(SITES), []
        must_be_ready(reservation.pk)
        created.append(sql)
    runs = []
    for user in users[1:]:
        COPIES[:] = []
        run_id, sql = counted(lambda user=user: run_one(user, image))
        must_have_run(run_id)
        runs.append(sql)
        copies["run"] += len(COPIES)
    written, read = deliver()
    del wake  # (imported so a broken wake module fails here, before any figure is printed)

    def mean(runs, only=lambda sql: sql):
        return round(sum(len(only(sql)) for sql in runs) / len(runs), 1)

    return {
        "reservation_accepted": mean(accepted),
        "reservation_accepted_work": mean(accepted, work),
        "vm_created": mean(created),
        "vm_created_work": mean(created, work),
        "run_completed": mean(runs),
        "run_completed_work": mean(runs, work),
        "copy_run": round(copies["run"] / len(runs), 1),
        "event_written": written,
        "event_relayed_per_poll": read,
        "copy_accepted": round(copies["accepted"] / len(accepted), 1),
        "copy_created": round(copies["created"] / len(created), 1),
    }, phases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", help="a disposable PostgreSQL database URL (default: a temporary SQLite file)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--detail", action="store_true", help="one acceptance and one build by kind and call site")
    parser.add_argument("--smoke", action="store_true", help="3 repeats")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeat = 3
    vendor = configure(args.postgres, "vclmgr-statements-")
    figures, phases = measure(args)
    total = round(figures["reservation_accepted"] + figures["vm_created"], 1)
    total_work = round(figures["reservation_accepted_work"] + figures["vm_created_work"], 1)
    print(f"statements per operation ({vendor}, sim driver, mean of {args.repeat}; [without transaction control])")
    print(
        f"  {'reservation accepted':<34} {figures['reservation_accepted']:>6}  [{figures['reservation_accepted_work']}]"
    )
    print(f"  {'VM created (build job, to ready)':<34} {figures['vm_created']:>6}  [{figures['vm_created_work']}]")
    print(f"  {'reservation to ready, total':<34} {total:>6}  [{total_work}]   target <= {TARGET}")
    if vendor == "postgresql":
        copy = f"{figures['copy_accepted']} + {figures['copy_created']}"
        print(f"  {'COPY, uncounted: accepted + built':<34} {copy:>6}   (bulk inserts; sent all the same)")
        sent = round(total + figures["copy_accepted"] + figures["copy_created"], 1)
        print(f"  {'reservation to ready, COPY too':<34} {sent:>6}          target <= {TARGET}")
    run = f"{figures['run_completed']}  [{figures['run_completed_work']}]"
    if vendor == "postgresql":
        run += f" + {figures['copy_run']} COPY"
    print(f"  {'run completed (submit to its end)':<34} {run:>6}")
    event = f"{figures['event_written']} + {figures['event_relayed_per_poll']}"
    print(f"  {'event delivered: written + read':<34} {event:>6}   (the read serves every event of one relay poll)")
    for phase, sites in phases.items():
        print(f"\none {phase}, {len(sites)} statements through a cursor (no COMMIT), by kind:")
        for kind, n in Counter(kind_of(sql) for sql, _ in sites).most_common():
            print(f"  {n:>4}  {kind}")
        print(f"one {phase}, by call site:")
        for where, n in Counter(where for _, where in sites).most_common():
            print(f"  {n:>4}  {where}")
    print(
        json.dumps(
            {"config": vendor, **figures, "reservation_to_ready": total, "reservation_to_ready_work": total_work}
        )
    )


if __name__ == "__main__":
    main()
