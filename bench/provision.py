"""VM provisioning throughput and submit→ready latency on simulated hosts, real worker processes.

    python bench/provision.py [--vms 200] [--hosts 16] [--workers 2] [--rate 20]
                              [--configs embedded,postgres] [--postgres URL] [--redis URL] [--profile DIR]

For each configuration (``embedded``: SQLite + django-q2's ORM broker, the default install;
``postgres``: PostgreSQL + Redis) it starts a fresh database, registers ``--hosts`` sim hosts
(zero step delays) and one image, starts a qcluster with ``--workers`` worker processes, then
  1. burst: requests ``--vms`` VMs at once through ``services.request_vm`` (what the API and
     the reservation flow call) and waits until every one is running or failed. VMs ready per
     second = ready VMs / (last ready − first submit); p50/p99 of submit→ready (VM.created →
     the ``running`` change's time) under that backlog;
  2. paced: requests ``--vms`` more at ``--rate`` per second (a steady load the target rate
     should absorb): p50/p99 submit→ready.
Targets: ≥ 20 VMs/s and p99 < 2 s.

``--profile DIR`` runs the workers under cProfile (one ``.prof`` per worker process, written
at exit) and prints the top functions by cumulative time.
``--postgres`` must name a disposable database: the bench empties it.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, child_env, percentile, run_child, setup_django, wait_for  # bench/ is on the script's path

VM_SIZE = {"vcpus": 1, "memory_mib": 512, "disk_gib": 5}
COUNTED = 20  # VMs whose statements are counted (after one per host, which stage the image)


# --- the measuring child (its environment selects the database and broker) ----------------


def one(args):
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    if connection.vendor == "postgresql":
        call_command("flush", interactive=False, verbosity=0)
    from django_q.brokers import get_broker

    get_broker().purge_queue()
    owner, image = setup(args)
    counted = count_queries(owner, image, args.hosts, COUNTED)
    get_broker().purge_queue()
    worker = start_workers(args)
    try:
        from monitoring.health import live_worker_count

        wait_for(lambda: live_worker_count() >= args.workers, 60, "the workers")
        result = {"config": args.label, **counted, **burst(owner, image, args.vms)}
        result.update(paced(owner, image, args.vms, args.rate))
        # CPU time of the whole qcluster (workers, pusher, monitor) per VM: comparable on a machine shared with others.
        result["cluster_cpu_ms_per_vm"] = round(1000 * group_cpu_seconds(worker.pid) / (2 * args.vms), 1)
    finally:
        stop(worker, graceful=bool(args.profile))
    print(json.dumps(result), flush=True)


def setup(args):
    """Hosts with room for both phases' VMs, one image with a sim variant, a plain user."""
    from django.contrib.auth import get_user_model

    from inventory import services as inventory
    from jobs import services as jobs
    from provisioning import services

    per_host = -(-(2 * args.vms + args.hosts + COUNTED) // args.hosts) + 1
    for n in range(args.hosts):
        inventory.create_hypervisor(
            actor="bench",
            name=f"sim{n:02d}",
            address=f"10.77.0.{n + 1}",
            driver="sim",
            cpus=per_host * VM_SIZE["vcpus"],
            memory_mib=per_host * VM_SIZE["memory_mib"] + 1024,
            disk_gib=per_host * VM_SIZE["disk_gib"] + 10,
        )
    image = services.create_image(actor="bench", name="bench-linux", os="Linux", min_memory_mib=256, default_disk_gib=5)
    services.add_variant(
        image, actor="bench", hypervisor_type="sim", format="sim", location="sim://library/bench-linux"
    )
    # Staff: what is measured is provisioning, not the quota (a user may hold only a few VMs at once).
    owner = get_user_model().objects.create_user("bench-user", password=os.urandom(8).hex(), is_staff=True)
    jobs.set_queue_settings(actor="bench", limit=max(4, args.workers * 2))
    return owner, image


def count_queries(owner, image, warm, count):
    """SQL statements per VM (request; claim + run its vm.create), in this process, image already staged."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs import tasks, wake

    top_up, wake.top_up = wake.top_up, lambda *args, **kwargs: 0
    try:
        for _ in range(warm):  # the first VM on each host stages the image: not the common case
            request(owner, image)
        tasks.run_next()
        with CaptureQueriesContext(connection) as submitted:
            for _ in range(count):
                request(owner, image)
        with CaptureQueriesContext(connection) as ran:
            tasks.run_next()
    finally:
        wake.top_up = top_up
    return {
        "submit_queries_per_vm": round(len(submitted) / count, 1),
        "run_queries_per_vm": round(len(ran) / count, 1),
    }


def start_workers(args):
    env = {**os.environ, "VCLMGR_WORKERS": str(args.workers), "LOG_LEVEL": "WARNING"}
    command = [sys.executable, "manage.py", "qcluster"]
    if args.profile:
        env["BENCH_PROFILE_DIR"] = args.profile
        command = [sys.executable, str(Path(__file__).resolve()), "--profiled-qcluster"]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def group_cpu_seconds(pgid):
    """User + system CPU time of the live processes of a process group (Linux /proc)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields[2] is pgrp, [11] utime, [12] stime (after the name)
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def stop(worker, graceful):
    """SIGTERM lets django-q2 end its workers' loops (so profiles are written); else SIGKILL the group."""
    if graceful:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(worker.pid, signal.SIGKILL)  # whatever of the group is left
    except ProcessLookupError:
        pass
    worker.wait()


def request(owner, image):
    from provisioning import services

    vm, _ = services.request_vm(actor="bench", owner=owner, image=image, **VM_SIZE)
    return vm.pk


def settled(ids, timeout):
    """Wait until every VM is running or failed; returns {id: (created, ready or None, state)}."""
    from provisioning.models import VM

    done = ("running", "failed")
    wait_for(lambda: VM.objects.filter(pk__in=ids, state__in=done).count() == len(ids), timeout, "the VMs")
    # ``updated`` is the time of the VM's last change: its becoming ready (nothing acts on it later).
    rows = VM.objects.filter(pk__in=ids).values_list("pk", "created", "updated", "state", "error")
    failed = [error for _, _, _, state, error in rows if state != "running"]
    if failed:
        print(f"{len(failed)} VMs failed, e.g. {failed[0][:300]}", file=sys.stderr, flush=True)
    return [(created, updated) for _, created, updated, state, _ in rows if state == "running"], len(failed)


def latencies(ready):
    return [(end - start).total_seconds() for start, end in ready]


def burst(owner, image, count):
    ids = [request(owner, image) for _ in range(count)]
    ready, failed = settled(ids, 900)
    span = (max(end for _, end in ready) - min(start for start, _ in ready)).total_seconds()
    waits = latencies(ready)
    return {
        "burst_vms_per_s": round(len(ready) / span, 1),
        "burst_p50_s": round(percentile(waits, 0.5), 3),
        "burst_p99_s": round(percentile(waits, 0.99), 3),
        "burst_failed": failed,
    }


def paced(owner, image, count, rate):
    ids = []
    start = time.monotonic()
    for index in range(count):
        time.sleep(max(0.0, start + index / rate - time.monotonic()))
        ids.append(request(owner, image))
    behind = time.monotonic() - start - (count - 1) / rate  # >0: submitting itself could not keep the rate
    ready, failed = settled(ids, 900)
    waits = latencies(ready)
    return {
        "paced_rate": rate,
        "paced_p50_s": round(percentile(waits, 0.5), 3),
        "paced_p99_s": round(percentile(waits, 0.99), 3),
        "paced_max_s": round(max(waits), 3),
        "paced_failed": failed,
        "paced_submit_lag_s": round(max(0.0, behind), 2),
    }


def profiled_qcluster():
    """``manage.py qcluster`` with every forked worker under cProfile (dumped at its exit)."""
    import atexit
    import cProfile

    os.chdir(ROOT)
    setup_django()

    def start_profile():
        profile = cProfile.Profile()
        path = Path(os.environ["BENCH_PROFILE_DIR"]) / f"worker-{os.getpid()}.prof"
        atexit.register(lambda: (profile.disable(), profile.dump_stats(path)))
        profile.enable()

    os.register_at_fork(after_in_child=start_profile)
    from django_q import cluster

    original = cluster.worker

    def worker(*a, **kw):  # multiprocessing ends a child with os._exit (no atexit): dump when the loop ends
        try:
            return original(*a, **kw)
        finally:
            atexit._run_exitfuncs()

    cluster.worker = worker
    from django.core.management import call_command

    call_command("qcluster")


def print_profile(directory, limit=30):
    import pstats

    files = sorted(str(p) for p in Path(directory).glob("*.prof"))
    if not files:
        print(f"no profiles in {directory}", file=sys.stderr)
        return
    stats = pstats.Stats(*files)
    stats.sort_stats("cumulative").print_stats(limit)
    stats.sort_stats("tottime").print_stats(limit)


# --- the parent: one child per configuration ---------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=20.0, help="paced phase: VMs requested per second")
    parser.add_argument("--configs", default="embedded,postgres")
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument(
        "--postgres",
        default=os.environ.get("BENCH_DATABASE_URL"),
        help="a DISPOSABLE PostgreSQL database (the postgres config is skipped without it)",
    )
    parser.add_argument("--profile", help="directory for worker cProfile dumps")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    parser.add_argument("--profiled-qcluster", action="store_true", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.profiled_qcluster:
        profiled_qcluster()
        return
    if args.one:
        one(args)
        return
    results = []
    for label in args.configs.split(","):
        if label == "postgres" and not args.postgres:
            print("postgres: skipped (give --postgres URL or BENCH_DATABASE_URL)", file=sys.stderr)
            continue
        results.append(run(label, args))
    keys = [
        "config",
        "burst_vms_per_s",
        "burst_p50_s",
        "burst_p99_s",
        "burst_failed",
        "paced_rate",
        "paced_p50_s",
        "paced_p99_s",
        "paced_max_s",
        "paced_failed",
        "cluster_cpu_ms_per_vm",
        "submit_queries_per_vm",
        "run_queries_per_vm",
    ]
    print(
        f"{args.vms} VMs on {args.hosts} sim hosts (zero delays), {args.workers} worker processes; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print(" | ".join(keys))
    for row in results:
        print(" | ".join(str(row[k]) for k in keys))
    if args.profile:
        print_profile(args.profile)


def run(label, args):
    with tempfile.TemporaryDirectory(prefix="vclmgr-bench-") as var:
        extra = {"DATABASE_URL": args.postgres, "REDIS_URL": args.redis} if label == "postgres" else {}
        env = child_env(var, label, **extra)
        command = [
            sys.executable,
            __file__,
            "--one",
            label,
            "--label",
            label,
            "--vms",
            str(args.vms),
            "--hosts",
            str(args.hosts),
            "--workers",
            str(args.workers),
            "--rate",
            str(args.rate),
        ]
        if args.profile:
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            command += ["--profile", str(Path(args.profile).resolve())]
        print(f"running {label} … (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
        result = run_child(command, env, label, echo_stderr=True)
        print(json.dumps(result), file=sys.stderr, flush=True)
        return result


if __name__ == "__main__":
    main()
