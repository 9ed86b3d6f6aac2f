"""Job system throughput and queue delay with real worker processes.

    python bench/job_queue.py [--jobs 1000] [--workers 2] [--brokers orm,redis] [--postgres URL]

For each broker (django-q2's ORM broker on SQLite; Redis; optionally PostgreSQL + Redis)
it starts a fresh database, then
  0. counts the queries per ``noop`` job (submit; claim + run + end) in this process;
  1. drain: queues ``--jobs`` ``noop`` jobs, starts a qcluster with ``--workers`` worker
     processes and measures dispatch throughput: jobs / (last end − first start), and the
     CPU time the qcluster's processes used per job (compare runs on a busy machine);
  2. burst: submits ``--jobs`` more while the workers run: jobs/s from the first submission
     to the last end (the submitting process shares the machine), and the queue-to-start
     delay (started − received) under that backlog;
  3. paced: submits 200 ``noop`` jobs at 40/s (the limit has room) — p50/p99 queue delay;
  4. chain: 100 jobs each depending on the previous — checks they ran strictly in order.
Targets: ≥ 100 jobs/s ORM, ≥ 300 jobs/s Redis, p99 paced delay < 1 s.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from _common import (  # bench/ is on the script's path
    child_env,
    percentile,
    run_child,
    setup_django,
    start_qcluster,
    wait_for,
)


def one(args):
    """Runs in a child process whose environment selects the database and broker."""
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    from jobs import services
    from jobs.models import Job
    from monitoring.health import live_worker_count

    call_command("migrate", verbosity=0)
    if connection.vendor == "postgresql":
        Job.objects.all().delete()
    from django_q.brokers import get_broker

    get_broker().purge_queue()
    services.set_queue_settings(actor="bench", limit=max(4, args.workers * 2))
    counted = count_queries(100)
    get_broker().purge_queue()
    t0 = time.monotonic()
    queued = [services.submit("noop", {}, actor="bench") for _ in range(args.jobs)]
    submit_rate = args.jobs / (time.monotonic() - t0)
    worker = start_qcluster(args.workers)
    try:
        wait_for(lambda: live_worker_count() >= args.workers, 60, "the workers")
        cpu = group_cpu_seconds(worker.pid)
        rows = _finished(queued, 600)
        cpu = group_cpu_seconds(worker.pid) - cpu
        span = (max(r.ended for r in rows) - min(r.started for r in rows)).total_seconds()
        result = {
            "broker": args.label,
            "submit_per_s": round(submit_rate, 1),
            "drain_jobs_per_s": round(len(rows) / span, 1),
            "drain_worker_cpu_ms_per_job": round(1000 * cpu / len(rows), 2),
            **counted,
        }
        result.update(burst(args.jobs))
        result.update(paced(200, 40))
        result.update(chain(100))
    finally:  # (a failed child's qcluster.log is shown by run_child)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    print(json.dumps(result), flush=True)


def group_cpu_seconds(pgid):
    """CPU time (user + system) used so far by the live processes of a process group (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields[2] is pgrp; utime and stime follow at 11 and 12
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def count_queries(count):
    """Queries per noop job: submitting, then claiming + running + ending it (in this process)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs import services, tasks, wake
    from jobs.models import Job

    top_up, wake.top_up = wake.top_up, lambda *args, **kwargs: 0
    try:
        with CaptureQueriesContext(connection) as submitted:
            jobs = [services.submit("noop", {}, actor="bench") for _ in range(count)]
        with CaptureQueriesContext(connection) as ran:
            done = tasks.run_next()
    finally:
        wake.top_up = top_up
    assert done == count, done
    Job.objects.filter(pk__in=[job.pk for job in jobs]).delete()
    return {
        "submit_queries_per_job": round(len(submitted) / count, 1),
        "run_queries_per_job": round(len(ran) / count, 1),
    }


def _finished(jobs, timeout):
    from jobs.models import Job

    ids = [job.pk for job in jobs]
    wait_for(lambda: Job.objects.filter(pk__in=ids, status__in=Job.FINAL).count() == len(ids), timeout, "the jobs")
    return list(Job.objects.filter(pk__in=ids).order_by("id"))


def _delays(rows):
    return [(row.started - row.received).total_seconds() for row in rows]


def burst(count):
    from jobs import services

    jobs = [services.submit("noop", {}, actor="bench") for _ in range(count)]
    rows = _finished(jobs, 600)
    assert all(row.status == "success" for row in rows)
    span = (max(r.ended for r in rows) - min(r.received for r in rows)).total_seconds()
    delays = _delays(rows)
    return {
        "burst_jobs_per_s": round(count / span, 1),
        "burst_p50_delay_s": round(percentile(delays, 0.5), 3),
        "burst_p99_delay_s": round(percentile(delays, 0.99), 3),
    }


def paced(count, rate):
    from jobs import services

    jobs = []
    start = time.monotonic()
    for index in range(count):
        time.sleep(max(0.0, start + index / rate - time.monotonic()))
        jobs.append(services.submit("noop", {}, actor="bench"))
    delays = _delays(_finished(jobs, 120))
    return {
        "paced_rate": rate,
        "paced_p50_delay_s": round(percentile(delays, 0.5), 3),
        "paced_p99_delay_s": round(percentile(delays, 0.99), 3),
    }


def chain(length):
    from jobs import services

    jobs = [services.submit("noop", {}, actor="bench")]
    for _ in range(length - 1):
        jobs.append(services.submit("noop", {}, actor="bench", depends=[jobs[-1].pk]))
    rows = _finished(jobs, 300)
    in_order = all(b.started >= a.ended for a, b in zip(rows, rows[1:], strict=False))
    span = (rows[-1].ended - rows[0].received).total_seconds()
    return {"chain": length, "chain_in_order": in_order, "chain_s": round(span, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--brokers", default="orm,redis")
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--postgres", help="also run PostgreSQL + Redis on this (disposable) database")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.one:
        one(args)
        return
    runs = []
    for broker in args.brokers.split(","):
        runs.append((broker, {"REDIS_URL": args.redis if broker == "redis" else ""}))
    if args.postgres:
        runs.append(("postgres+redis", {"REDIS_URL": args.redis, "DATABASE_URL": args.postgres}))
    results = []
    for label, extra in runs:
        with tempfile.TemporaryDirectory(prefix="vclmgr-bench-") as var:
            env = child_env(var, label, **extra)
            command = [
                sys.executable,
                __file__,
                "--one",
                label,
                "--label",
                label,
                "--jobs",
                str(args.jobs),
                "--workers",
                str(args.workers),
            ]
            print(f"running {label} …", file=sys.stderr, flush=True)
            results.append(run_child(command, env, label))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    keys = [
        "broker",
        "drain_jobs_per_s",
        "drain_worker_cpu_ms_per_job",
        "burst_jobs_per_s",
        "submit_per_s",
        "burst_p50_delay_s",
        "burst_p99_delay_s",
        "paced_p50_delay_s",
        "paced_p99_delay_s",
        "chain_in_order",
        "chain_s",
        "submit_queries_per_job",
        "run_queries_per_job",
    ]
    print(f"{args.jobs} noop jobs, {args.workers} worker processes")
    print(" | ".join(keys))
    for row in results:
        print(" | ".join(str(row[k]) for k in keys))


if __name__ == "__main__":
    main()
