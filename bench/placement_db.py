"""Placement through the database claim: 10,000 hosts, 100,000 time-windowed allocations.

Run: ``python bench/placement_db.py [--hosts N] [--allocations M] [--claims K]`` (or
``--quick``: 1,000 hosts; ``--smoke``: 200 hosts, seconds). Uses
``DATABASE_URL`` when it points at PostgreSQL, else creates and migrates the database
``vclmgr_bench`` on the local PostgreSQL (127.0.0.1:5432). Prints snapshot load time and
claim latency p50/p95/p99 (target p95 < 50 ms).
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/vclmgr_bench"


def ensure_database(url):
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--allocations", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="1,000 hosts, 10,000 allocations")
    parser.add_argument("--smoke", action="store_true", help="200 hosts, 2,000 allocations, 30 claims")
    args = parser.parse_args()
    if args.quick:
        args.hosts, args.allocations, args.claims = 1000, 10_000, 100
    if args.smoke:
        args.hosts, args.allocations, args.claims = 200, 2000, 30
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        url = DEFAULT_URL
        ensure_database(url)
    os.environ.update({"DATABASE_URL": url, "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "vclmgr.settings"})
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, check=True)

    import django

    django.setup()
    from datetime import timedelta

    from django.utils import timezone

    from capacity import services
    from capacity.models import Allocation
    from capacity.snapshot import snapshot
    from core.changelog import Actor
    from inventory.models import Hypervisor

    rng = random.Random(7)
    Allocation.objects.all().delete()
    Hypervisor.objects.all().delete()
    t = time.perf_counter()
    Hypervisor.objects.bulk_create(
        Hypervisor(
            name=f"b{i:05d}",
            address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            driver="sim",
            cpus=32,
            memory_mib=262144,
            disk_gib=4000,
        )
        for i in range(args.hosts)
    )
    ids = list(Hypervisor.objects.values_list("id", flat=True))
    now = timezone.now()
    rows = []
    for n in range(args.allocations):
        start = now + timedelta(minutes=rng.randrange(-600, 7 * 24 * 60))
        rows.append(
            Allocation(
                host_id=rng.choice(ids),
                purpose=f"bench {n}",
                vcpus=rng.choice([1, 2, 4]),
                memory_mib=rng.choice([2048, 4096, 8192]),
                disk_gib=20,
                start=start,
                end=start + timedelta(hours=rng.choice([1, 2, 4, 8])),
            )
        )
    Allocation.objects.bulk_create(rows, batch_size=5000)
    from django.db import connection

    with connection.cursor() as cursor:  # what autovacuum does soon after a bulk load
        cursor.execute("ANALYZE")
    setup = time.perf_counter() - t

    snapshot.reset()
    t = time.perf_counter()
    with snapshot.lock:
        snapshot.current()
    load = time.perf_counter() - t

    actor = Actor(name="bench")
    latencies, cpu = [], []
    for n in range(args.claims):
        start = now + timedelta(minutes=rng.randrange(0, 3 * 24 * 60))
        demand = services.Demand(
            vcpus=2, memory_mib=4096, disk_gib=20, start=start, end=start + timedelta(hours=2), purpose=f"claim {n}"
        )
        t, c = time.perf_counter(), time.process_time()
        services.claim(demand, actor=actor)
        latencies.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    latencies.sort()
    cpu.sort()

    def pct(p, values=latencies):
        return values[min(len(values) - 1, int(p / 100 * len(values)))]

    print(f"database: {url.split('@')[-1]}  hosts: {args.hosts:,}  allocations: {args.allocations:,}")
    print(f"{'setup (bulk insert)':<34}{setup:>10.2f} s")
    print(f"{'snapshot full load':<34}{load:>10.2f} s")
    print(f"{'claims':<34}{args.claims:>10}")
    print(f"{'claim p50':<34}{pct(50):>10.2f} ms")
    print(f"{'claim p95 (target < 50 ms)':<34}{pct(95):>10.2f} ms")
    print(f"{'claim p99':<34}{pct(99):>10.2f} ms")
    print(f"{'claim mean':<34}{statistics.mean(latencies):>10.2f} ms")
    print(f"{'claim CPU in this process p50/p95':<34}{pct(50, cpu):>10.2f} / {pct(95, cpu):.2f} ms")
    print("load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
