"""Environment benchmark: placement of environments (pure), and one on real QEMU beside raw boots.

    python bench/environments.py            # 1,000 three-machine environments on 2,000 hosts
    python bench/environments.py --smoke    # tiny sizes, seconds: does it still run?
    python bench/environments.py --real [--runs 3] [--no-placement]   (root: private libvirtd)

Each environment is a gang (``placement.place_gang``) of three machines of one window on one
private network, so all three share a host (the way a template's networks join its machines). The hosts
already hold time-windowed allocations (``_placement_workloads.big_cluster``). Each decision
is recorded (``commit``), so later environments see the earlier ones. Pure core: the
database claim (``capacity.claim_gang``) is one short transaction per machine on top.

real (``--real``, off by default: it needs root and QEMU): the test guest of
``tools/guest-image/build.py`` on the private libvirtd of ``tools/localkvm.py``, ``--runs``
times, raw and vclmgr interleaved so that both see the same load:
  a. raw: an isolated network (``drivers.libvirt.netxml``, the XML vclmgr's driver writes: no
     ``<forward>``, DHCP and names for the three) defined and started, then three guests
     (``tests/realvm.domain_xml``: 256 MiB, 1 vCPU, direct kernel boot, a fresh seed each, a
     user-mode NIC forwarded from 127.0.0.1 and a NIC on the network) defined and started at
     once, until all three send their SSH banner; then all of it removed;
  b. vclmgr: a fresh SQLite database, the daemon registered as a ``libvirt`` host (domain type
     qemu, user-mode network), the guest as an image (kernel boot, ready when its SSH port
     greets: the same readiness as the raw side), staged before the first run, a template of
     three members of that image on one private network (256 MiB each), a real qcluster of 3
     workers: ``reservations.services.reserve_environment`` (what the API's POST calls) until
     the head (the entry machine) is ``ready``, which it is when all three are; then ended and
     waited for until every VM and the network are gone.
vclmgr's share is (b) − (a) of the same run; p50 and p90 of each and of the share (target:
share < 1 s). On a loaded machine the boots' spread swamps that difference, so beside it is
vclmgr's own share measured on its own VMs: reserve → ready less the start and boot of the
machine ready last (its build job's start, address and ready steps). The two domains differ a
little (vclmgr's has a VNC display, ``cache='none'``). The load average is printed with the
figures: software emulation stretches with it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta

# The project first: its app ``environments`` must win over this file's own name.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import _placement_workloads as work  # noqa: E402
from bench._common import child_env, run_child, setup_django, start_qcluster  # noqa: E402
from bench.placement_core import percentile, table  # noqa: E402
from placement import Gang, PlacementEngine, PlacementOptions, place_gang  # noqa: E402

MACHINES = ("gateway", "client", "server")
READY_TIMEOUT = 600  # s: three guests boot at once under software emulation on a shared machine
TARGET_SHARE = 1.0  # s: vclmgr's share of an environment's reserve → ready


def gangs(n: int, now: float) -> list[Gang]:
    """``n`` environments: three machines each (the sizes of the workload's images), one window."""
    out = []
    asks = work.requests(3 * n, now, prefix="m")
    for i in range(n):
        three = asks[3 * i : 3 * i + 3]
        window = {"start": three[0].start, "end": three[0].end}
        members = tuple(replace(m, id=f"env{i}:{name}", **window) for m, name in zip(three, "abc", strict=True))
        out.append(Gang(members=members, together=(frozenset(m.id for m in members),), id=f"env{i}"))
    return out


def placement(args) -> None:
    hosts, allocations, environments = (50, 200, 40) if args.smoke else (2000, 20000, 1000)
    cluster = work.big_cluster(hosts, allocations)
    engine = PlacementEngine(cluster, PlacementOptions(default_policy="balanced"))
    engine.warm()
    timings, placed, refused_timings = [], 0, []
    for gang in gangs(environments, cluster.now):
        t0 = time.perf_counter()
        result = place_gang(engine, gang, commit=True)
        spent = time.perf_counter() - t0
        (timings if result.ok else refused_timings).append(spent)
        placed += result.ok
    every = timings + refused_timings
    rows = [
        [
            f"{environments:,} × 3 machines",
            f"{hosts:,} hosts, {allocations:,} allocations",
            f"{placed:,}",
            f"{percentile(every, 50) * 1000:.2f}",
            f"{percentile(every, 99) * 1000:.2f}",
            f"{statistics.mean(every) * 1000:.2f}",
        ]
    ]
    table(
        "environment placement (pure core, one decision per environment, recorded)",
        ["environments", "cluster", "placed", "p50 ms", "p99 ms", "mean ms"],
        rows,
    )
    if refused_timings:
        print(f"refused: {len(refused_timings)} (each with its earliest start for all: p50 "
              f"{percentile(refused_timings, 50) * 1000:.1f} ms)")  # fmt: skip


# --- real QEMU: raw boots of three ----------------------------------------------------------


def raw_network(key, cidr, names):
    """The isolated network of the raw side, as vclmgr's driver would write it: (XML, MACs)."""
    from drivers.base import NetworkSpec
    from drivers.libvirt import domxml, netxml

    hosts = tuple((name, domxml.mac_address(f"{key}-{name}")) for name in names)
    return netxml.network_xml(NetworkSpec(key=key, cidr=cidr, hosts=hosts)), [mac for _, mac in hosts]


def raw_three(conn, pool, cidr):
    """Seconds from define + start of the network and the three guests to the last SSH banner."""
    from tests import realvm

    key = f"{realvm.PREFIX}bench-env-{os.urandom(3).hex()}"
    xml, macs = raw_network(key, cidr, MACHINES)
    seeds = [realvm.seed_for(realvm.new_login()) for _ in MACHINES]
    guests, net = [], None

    def start(n):
        guest = realvm.start_guest(pool, f"{key}-{MACHINES[n]}", seeds[n], "kernel", networks=[(key, macs[n])])
        guests.append(guest)
        return guest

    t0 = time.monotonic()
    try:
        net = conn.networkDefineXML(xml)
        net.create()
        with ThreadPoolExecutor(len(MACHINES)) as ex:
            started = list(ex.map(start, range(len(MACHINES))))
        with ThreadPoolExecutor(len(MACHINES)) as ex:
            answered = list(ex.map(lambda g: g.started + g.wait_ssh(READY_TIMEOUT), started))
        return max(answered) - t0
    finally:
        for guest in guests:
            realvm.remove_guest(pool, guest)
        if net is not None:
            realvm.remove_network(conn, key)


# --- real QEMU: vclmgr's environment ---------------------------------------------------------


def wait(what, predicate, worker, timeout):
    deadline = time.monotonic() + timeout
    while (got := predicate()) is None:
        if worker.poll() is not None:
            raise SystemExit(f"the worker stopped while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return got


def vclmgr_three(user, template, worker):
    """Seconds from ``reserve_environment`` to the head ``ready``; then ended and waited for
    until every machine's VM and the private network are gone (not timed)."""
    from provisioning.models import PrivateNetwork
    from reservations import services as reservations
    from reservations.models import Reservation

    t0 = time.monotonic()
    head = reservations.reserve_environment(user, template, actor=user, duration=timedelta(hours=1))

    def ready():
        fresh = Reservation.objects.get(pk=head.pk)
        if fresh.status in ("failed", "ended"):
            raise SystemExit(f"environment {head.pk} {fresh.status}: {fresh.error}")
        return fresh if fresh.status == "ready" else None

    head = wait(f"environment {head.pk} ready", ready, worker, READY_TIMEOUT)
    spent = time.monotonic() - t0
    machines = Reservation.objects.filter(pk=head.pk) | Reservation.objects.filter(head=head)
    boot = last_boot([r.vm_id for r in machines])
    reservations.end(head, actor=user)

    def gone():
        rows = machines.select_related("vm")
        done = all((r.status, r.vm.state) == ("ended", "destroyed") for r in rows)
        return True if done and not PrivateNetwork.objects.filter(removed__isnull=True).exists() else None

    wait(f"environment {head.pk} torn down", gone, worker, 300)
    return {"ready": spent, "boot": boot, "own": spent - boot}


BOOT_STEPS = ("start", "address", "ready")  # libvirt's start of the domain, the guest's boot until it answers


def last_boot(vm_ids):
    """Seconds the build of the machine ready last spent in libvirt's start and its guest's
    boot (its ``vm.create`` job's start, address and ready steps): what the raw side also
    waits for, measured on vclmgr's own VMs, so the load of the moment cancels out."""
    from jobs.models import Job

    builds = []
    for vm_id in vm_ids:
        job = Job.objects.filter(opcode="vm.create", params__vm=vm_id).order_by("-pk").first()
        spent, before = {}, job.started
        for step in job.steps:  # a step's time: from the previous step's end to its own
            ended = datetime.fromisoformat(step["ended"])
            spent[step["name"]] = (ended - before).total_seconds()
            before = ended
        builds.append((before, sum(v for k, v in spent.items() if k.startswith(BOOT_STEPS))))
    return max(builds)[1]


def real_child(args):
    """The real part in a child (its own database): prints one JSON line of measurements."""
    import json

    import libvirt
    from django.contrib.auth import get_user_model

    from environments import services as environments
    from provisioning.models import PrivateNetwork
    from provisioning.opcodes.staging import stage_variant
    from tests import realvm
    from tests.localkvm_inventory import kvm_guest_image, kvm_host

    image_info = realvm.guest_image()
    daemon = realvm.Libvirtd.acquire()  # lists its socket in VCLMGR_LIBVIRT_SOCKETS for the workers
    conn = libvirt.open(daemon.uri)
    raw_pool = pool = worker = None
    try:
        raw_pool = realvm.Pool(conn, image_info, name=f"{realvm.PREFIX}bench-env-raw")
        for name in ("vmlinux", "initrd"):  # once, before the three starts at once would copy them
            raw_pool.stage(name, name)
        pool = realvm.Pool(conn, image_info, name=f"{realvm.PREFIX}bench-env", stage=False)
        host = kvm_host(daemon.uri, pool.name, actor="bench", memory_mib=4096, disk_gib=50, cpu_ratio=8)
        image = kvm_guest_image(image_info, "bench-guest", actor="bench")  # kernel boot, ready on SSH
        stage_variant(host, image.variants.get(), None)  # the copy is no run's: staged before them
        user = get_user_model().objects.create_user("bench-user", password=os.urandom(8).hex(), is_staff=True)
        raw_cidr = realvm.unused_range()
        members = [
            {"name": name, "image": image, "networks": ["lan"], "entry": name == MACHINES[0], "memory_mib": 256}
            for name in MACHINES
        ]
        cidr = realvm.unused_range(avoid=[raw_cidr])  # the raw network is up only during its runs
        template = environments.create_template(
            actor=user, name="trio", members=members, networks=[{"name": "lan", "cidr": cidr}]
        )
        worker = start_qcluster(len(MACHINES))
        runs = []
        for _ in range(args.runs):  # interleaved: raw and vclmgr under the same load
            load = os.getloadavg()[0]
            raw = raw_three(conn, raw_pool, raw_cidr)
            vclmgr = vclmgr_three(user, template, worker)
            runs.append({"raw": raw, **vclmgr, "load": [load, os.getloadavg()[0]]})
            print(
                f"run {len(runs)}: raw {raw:.2f} s, vclmgr {vclmgr['ready']:.2f} s (own {vclmgr['own']:.2f} s), "
                f"load {load:.2f}",
                file=sys.stderr,
            )
        print(json.dumps({"runs": runs}), flush=True)
    finally:
        if worker is not None:
            worker.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(30)
            with contextlib.suppress(ProcessLookupError):  # whatever of its group is left
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        pools = [p for p in (pool, raw_pool) if p is not None]
        realvm.remove_domains_on(conn, [p.path for p in pools])
        for key in {n.key for n in PrivateNetwork.objects.all()}:
            realvm.remove_network(conn, key)
        for p in pools:
            p.close()
        conn.close()
        daemon.release()


def print_real(got):
    runs = got["runs"]
    rows = {
        "raw: network + 3 guests define+start → all SSH banners": [r["raw"] for r in runs],
        "vclmgr: reserve_environment → head ready": [r["ready"] for r in runs],
        "vclmgr's share (vclmgr − raw, per run)": [r["ready"] - r["raw"] for r in runs],
        "  of which the last machine's start + boot": [r["boot"] for r in runs],
        "vclmgr's own share (ready − that start + boot)": [r["own"] for r in runs],
    }
    loads = [x for r in runs for x in r["load"]]
    table(
        f"3-machine environment on real QEMU (TCG), 256 MiB, 1 vCPU, kernel boot, {len(runs)} runs "
        f"(load average {min(loads):.2f}–{max(loads):.2f})",
        ["seconds", "p50", "p90", "min", "max"],
        [[label, *(f"{x:.2f}" for x in spread(values))] for label, values in rows.items()],
    )
    for label in ("vclmgr's share (vclmgr − raw, per run)", "vclmgr's own share (ready − that start + boot)"):
        share = percentile(rows[label], 50)
        verdict = "met" if share < TARGET_SHARE else "missed"
        print(f"target {label.split(' (')[0]} < {TARGET_SHARE:g} s: {verdict} (p50 {share:.2f} s)")


def spread(values):
    return percentile(values, 50), percentile(values, 90), min(values), max(values)


def real(args):
    with tempfile.TemporaryDirectory(prefix="vclmgr-bench-") as var:
        from cryptography.fernet import Fernet

        # DEBUG off, as in production: a reservation's one-time password is stored encrypted.
        env = child_env(var, "env-real", CREDENTIAL_KEY=Fernet.generate_key().decode())
        command = [sys.executable, os.path.abspath(__file__), "--one", "real", "--runs", str(args.runs)]
        print(f"running real … (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
        print_real(run_child(command, env, "environments real", timeout=3600, echo_stderr=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    parser.add_argument("--real", action="store_true", help="also an environment on real QEMU (root, libvirtd)")
    parser.add_argument("--runs", type=int, default=3, help="real: runs of each kind (raw, vclmgr)")
    parser.add_argument("--no-placement", action="store_true", help="skip the pure placement part")
    parser.add_argument("--one", choices=("real",), help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()  # run_all.py hands every bench the same arguments
    if args.one:
        setup_django()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        return real_child(args)
    if not args.no_placement:
        placement(args)
    if args.real:
        real(args)
    return None


if __name__ == "__main__":
    main()
