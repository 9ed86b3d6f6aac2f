"""Two processes race for the last slots: exactly the capacity is claimed, never more."""

import subprocess
import sys
import textwrap

import pytest
from django.db.models import Sum

from capacity.models import Allocation
from tests.images import sim_image
from tests.processes import ROOT, child_env

pytestmark = pytest.mark.slow

RACER = textwrap.dedent(
    """
    import django, sys, time
    django.setup()
    from datetime import timedelta
    from django.utils import timezone
    from capacity import services
    from core.changelog import Actor
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


def race(script, processes=2):
    """Run ``script`` in that many processes at once; their outputs (each must exit 0)."""
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(n)],
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    results = [racer.communicate(timeout=120) for racer in racers]
    for racer, (_out, err) in zip(racers, results, strict=True):
        assert racer.returncode == 0, err[-3000:]
    return [out for out, _err in results]


def test_two_processes_racing_for_the_last_slots_never_overcommit(transactional_db, make_host):
    hosts = [make_host(f"race{i}", cpus=3, cpu_ratio=2.0, memory_mib=65536) for i in range(4)]
    capacity = 4 * 3 * 2
    results = race(RACER)
    won = [int(out.strip().splitlines()[-1]) for out in results]
    assert sum(won) == capacity
    assert Allocation.objects.count() == capacity
    for host in hosts:
        used = Allocation.objects.filter(host=host).aggregate(v=Sum("vcpus"))["v"]
        assert used == 6, f"{host.name} holds {used} vCPUs of 6"


GROUP_RACER = textwrap.dedent(
    """
    import django, sys
    django.setup()
    from datetime import timedelta
    from django.utils import timezone
    from capacity import services
    from capacity.snapshot import snapshot
    from provisioning import services as vms
    from provisioning.models import Image
    from core.changelog import Actor
    image = Image.objects.get(name="replica")
    start = timezone.now().replace(microsecond=0)
    snapshot.current()  # both racers decide on a snapshot taken before either claimed
    won = tries = 0
    while tries < 50:
        tries += 1
        demand = vms.demand_for(image, vms.size_for(image), start=start, end=start + timedelta(hours=2),
                                purpose=f"racer {sys.argv[1]}")
        try:
            services.claim(demand, actor=Actor(name="racer"))
            won += 1
        except services.NoCapacity as refused:
            print(refused)
            break
        except services.TryAgain:
            continue
    print(won)
    """
)


def test_concurrent_claims_of_one_anti_affinity_group_never_share_a_host(transactional_db, make_host):
    """#13 item 12: an image's group reaches real claims, and the locked re-check sees the
    other process's claims of the group, so two racing claims cannot both land on one host."""
    hosts = [make_host(f"aa{i}", cpus=64, memory_mib=262144) for i in range(3)]  # room for many, one per group
    sim_image("replica", size_gib=0, anti_affinity="replicas")
    results = race(GROUP_RACER)
    assert sum(int(out.strip().splitlines()[-1]) for out in results) == len(hosts)
    assert all("anti-affinity" in out for out in results), results
    per_host = [Allocation.objects.filter(host=host, anti_affinity="replicas").count() for host in hosts]
    assert per_host == [1, 1, 1]
