"""Two processes race for the last slots: exactly the capacity is claimed, never more."""

import subprocess
import sys
import textwrap

import pytest
from django.db.models import Sum

from provisioning.capacity.models import Allocation
from tests.processes import ROOT, child_env

pytestmark = pytest.mark.slow

RACER = textwrap.dedent(
    """
    import django, sys, time
    django.setup()
    from datetime import timedelta
    from django.utils import timezone
    from provisioning.capacity import services
    from vclmgr.changelog import Actor
    start = timezone.now().replace(microsecond=0)
    won = 0
    while True:
        demand = services.Demand(vcpus=1, memory_mib=256, disk_gib=1, start=start, end=start + timedelta(hours=2),
                                 purpose=f"racer {sys.argv[1]}")
        try:
            services.claim(demand, actor=Actor(name="racer"))
            won += 1
        except services.NoCapacity:
            break
        except services.TryAgain:
            continue
    print(won)
    """
)


def test_two_processes_racing_for_the_last_slots_never_overcommit(transactional_db, make_host):
    hosts = [make_host(f"race{i}", cpus=3, cpu_ratio=2.0, memory_mib=65536) for i in range(4)]
    capacity = 4 * 3 * 2
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(n)], cwd=ROOT, env=child_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(2)
    ]  # fmt: skip
    results = [racer.communicate(timeout=120) for racer in racers]
    for racer, (_out, err) in zip(racers, results, strict=True):
        assert racer.returncode == 0, err[-3000:]
    won = [int(out.strip().splitlines()[-1]) for out, _ in results]
    assert sum(won) == capacity
    assert Allocation.objects.count() == capacity
    for host in hosts:
        used = Allocation.objects.filter(host=host).aggregate(v=Sum("vcpus"))["v"]
        assert used == 6, f"{host.name} holds {used} vCPUs of 6"
