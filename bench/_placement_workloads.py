"""Workloads for bench/placement_core.py: big time-windowed clusters and a VCL-style lab.

All generators are deterministic (seeded) so runs compare.
"""

from __future__ import annotations

import random

from placement import Allocation, Cluster, Host, Request, Resources

DAY = 86400.0
HOUR = 3600.0

#: (vcpus, memory MiB, disk GiB, share of requests) — small lab images to large ones.
IMAGES = [
    (1, 2048, 20, 0.35),
    (2, 4096, 40, 0.30),
    (4, 8192, 60, 0.20),
    (8, 16384, 100, 0.10),
    (16, 32768, 200, 0.05),
]
HOST_TYPES = [
    # (cores, memory MiB, disk GiB)
    (32, 262144, 2000),
    (48, 393216, 4000),
    (64, 524288, 4000),
]


def _image(rng: random.Random) -> tuple[int, int, int]:
    vcpus, mem, disk, _ = rng.choices(IMAGES, [w for *_, w in IMAGES])[0]
    return vcpus, mem, disk


def big_cluster(hosts: int, allocations: int, seed: int = 1, horizon_days: float = 30):
    """``hosts`` hypervisors holding ``allocations`` reservations over the next
    ``horizon_days`` (1–8 h each) plus running VMs (10 % of allocations, open-ended)."""
    rng = random.Random(seed)
    now = 1_800_000_000.0
    per_host: list[list[Allocation]] = [[] for _ in range(hosts)]
    kinds = [rng.choice(HOST_TYPES) for _ in range(hosts)]
    for i in range(allocations):
        h = rng.randrange(hosts)
        vcpus, mem, disk = _image(rng)
        if rng.random() < 0.1:
            start, end = now - rng.uniform(0, 7 * DAY), None
        else:
            start = now + rng.uniform(0, horizon_days * DAY)
            end = start + rng.choice([1, 2, 2, 3, 4, 8]) * HOUR
        per_host[h].append(Allocation(f"a{i}", Resources(vcpus, mem, disk), start, end))
    out = []
    for i, (cores, mem, disk) in enumerate(kinds):
        out.append(
            Host(
                f"hv{i:05d}",
                Resources(cores, mem, disk),
                reserved=Resources(2, 8192, 50),
                overcommit={"vcpus": 4.0},
                group=f"bc{i // 14:03d}",
                allocations=tuple(per_host[i]),
            )
        )
    return Cluster(tuple(out), now=now)


def requests(n: int, now: float, seed: int = 2, horizon_days: float = 30, prefix="r"):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        vcpus, mem, disk = _image(rng)
        start = now + rng.uniform(0, horizon_days * DAY)
        end = start + rng.choice([1, 2, 3, 4]) * HOUR
        out.append(Request(Resources(vcpus, mem, disk), start, end, f"{prefix}{i}"))
    return out


def lab_workload(n: int, seed: int = 3, days: float = 7):
    """Reservations for one blade center: mixed images, random starts, 1–4 h."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        vcpus, mem, disk = _image(rng)
        start = rng.uniform(0, days * DAY)
        # Round to 15 minutes, like a reservation form.
        start -= start % 900
        end = start + rng.choice([1, 1, 2, 2, 3, 4]) * HOUR
        out.append(Request(Resources(vcpus, mem, disk), start, end, f"lab{i}"))
    return out


def blade_center(blades: int = 14, cores: int = 32, mem: int = 262144, disk: int = 2000):
    return Cluster(
        tuple(
            Host(f"blade{i:02d}", Resources(cores, mem, disk), reserved=Resources(2, 8192, 50)) for i in range(blades)
        )
    )


def vcl_static_slots(center: Cluster, requests, slot: tuple[int, int, int]) -> int:
    """VCL-style: each blade is cut into fixed VM slots of one size; a reservation takes a
    free slot for its window if its image fits the slot. Returns how many were accepted."""
    vcpus, mem, disk = slot
    slots = []
    for h in center.hosts:
        usable = h.usable()
        count = int(min(usable.vcpus // vcpus, usable.memory_mib // mem, usable.disk_gib // disk))
        slots += [[] for _ in range(count)]
    accepted = 0
    for r in requests:
        res = r.resources
        if res.vcpus > vcpus or res.memory_mib > mem or res.disk_gib > disk:
            continue
        for busy in slots:
            if all(r.end <= s or e <= r.start for s, e in busy):
                busy.append((r.start, r.end))
                accepted += 1
                break
    return accepted
