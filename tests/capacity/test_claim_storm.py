"""A storm of overlapping claims from two processes: each claim runs inside a
caller's transaction that holds on a moment after it, as a reservation's does. No claim may
fail with an error (a deadlock on PostgreSQL was a 500), and every refused claim must truly
not fit: the claims only add up, so one that fits the final state would have fitted when it
was refused."""

import json
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone

from capacity import services
from capacity.models import Allocation
from capacity.snapshot import snapshot
from tests.processes import ROOT, child_env

pytestmark = pytest.mark.slow

HOSTS, CPUS = 6, 4
THREADS, CLAIMS = 8, 30  # per process

STORM = textwrap.dedent(
    """
    import django, json, random, sys, threading, time
    django.setup()
    from datetime import datetime, timedelta
    from django.db import connection, transaction
    from capacity import services
    from core.changelog import Actor

    base = datetime.fromisoformat(sys.argv[2])
    results = {"ok": 0, "refused": [], "errors": []}
    gate = threading.Barrier(int(sys.argv[3]))

    def storm(seed):
        rnd = random.Random(seed)
        gate.wait()
        for _ in range(int(sys.argv[4])):
            hour, hours, vcpus = rnd.randrange(6), rnd.randint(1, 3), rnd.choice((1, 1, 2))
            start = base + timedelta(hours=hour)
            demand = services.Demand(vcpus=vcpus, memory_mib=256, disk_gib=1, start=start,
                                     end=start + timedelta(hours=hours), purpose=f"storm {seed}")
            try:
                with transaction.atomic():  # the caller's transaction, as reserve() has one
                    services.claim(demand, actor=Actor(name="storm"))
                    time.sleep(rnd.random() * 0.05)  # the rest of the caller's writes
                results["ok"] += 1
            except (services.NoCapacity, services.TryAgain) as exc:
                results["refused"].append([hour, hours, vcpus, type(exc).__name__])
            except Exception as exc:
                results["errors"].append(repr(exc)[:300])
        connection.close()

    threads = [threading.Thread(target=storm, args=(int(sys.argv[1]) * 100 + n,)) for n in range(int(sys.argv[3]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(results))
    """
)


def test_a_storm_of_overlapping_claims_has_no_errors_and_refuses_only_what_cannot_fit(transactional_db, make_host):
    hosts = [make_host(f"storm{i}", cpus=CPUS, cpu_ratio=1.0, memory_mib=65536) for i in range(HOSTS)]
    base = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", STORM, str(n), base.isoformat(), str(THREADS), str(CLAIMS)],
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    outputs = [racer.communicate(timeout=300) for racer in racers]
    for racer, (_out, err) in zip(racers, outputs, strict=True):
        assert racer.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    errors = [e for r in results for e in r["errors"]]
    assert errors == [], f"{len(errors)} claims failed with an error, e.g. {errors[:3]}"
    won = sum(r["ok"] for r in results)
    assert Allocation.objects.count() == won
    refused = [tuple(x) for r in results for x in r["refused"]]
    assert won + len(refused) == 2 * THREADS * CLAIMS
    snapshot.reset()
    wrongly = []
    for hour, hours, vcpus, why in refused:
        start = base + timedelta(hours=hour)
        end = start + timedelta(hours=hours)
        demand = services.Demand(vcpus=vcpus, memory_mib=256, disk_gib=1, start=start, end=end)
        if services.plan(demand).ok:
            wrongly.append((hour, hours, vcpus, why))
    assert wrongly == [], f"{len(wrongly)} of {len(refused)} refused claims would fit, e.g. {wrongly[:5]}"
    for host in hosts:  # and never overcommitted, at any hour
        for hour in range(8):
            moment = base + timedelta(hours=hour, minutes=30)
            live = Allocation.objects.filter(host=host, start__lte=moment, end__gt=moment)
            used = live.aggregate(v=Sum("vcpus"))["v"]
            assert (used or 0) <= CPUS, f"{host.name} holds {used} vCPUs at {moment}"
