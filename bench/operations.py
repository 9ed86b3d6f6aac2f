"""Cluster operations as plans, executed by real worker processes on the simulator (zero delay).

    python bench/operations.py [--workers 4] [--evacuate-vms 100] [--hosts 200] [--vms 2000]
        [--max-moves N] [--ganeti-timeout S] [--only evacuate|hbal] [--smoke]

1. evacuate: one sim host holding ``--evacuate-vms`` VMs (sized to fit on it), ten empty ones; ``node evacuate`` as a
   plan under ``rate-limit:4:…``: time from execute to the host being empty, and the largest
   number of migrations running at once (from the job rows' start and end times).
2. hbal: ``--hosts`` hosts, half of them holding ``--vms`` VMs, half empty: plan time
   (``plans.compute``, in process) against Ganeti's ``hbal -t`` on the same cluster exported as
   an htools text file (and our ``htools hbal --ganeti-file`` on it, whole process), then
   the execution time of the plan's moves and the most migrations running at once.

   Bounded, the same for both sides: ``--max-moves N`` is our plan's and CLI's limit and
   Ganeti's ``hbal -l N`` (``--max-length``); 0 lets both converge. Ganeti's hbal runs its
   steepest descent on every size (a large cluster can take hours), so its run is capped at
   ``--ganeti-timeout`` seconds and then reported as "timeout after Ts"; each run's CPU time
   (user + system of the child) is reported beside its wall time, as the machine may be shared.

Each run uses a fresh SQLite database in a temporary directory (ORM broker, no Redis).
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

from _common import ROOT, child_env, run_child, setup_django, wait_for  # bench/ is on the script's path


def seed(hosts, full, vms, memory_mib=1024):
    """``hosts`` sim hosts; ``vms`` running VMs spread evenly over the first ``full`` of them,
    written straight as rows (a VM, its claim, the simulator's VM), as vm.create leaves them."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from capacity.models import Allocation
    from drivers.base import vm_key
    from drivers.sim import services as sim
    from drivers.sim.models import SimVM
    from inventory.models import Hypervisor
    from provisioning import services
    from provisioning.models import VM

    admin = get_user_model().objects.create_user("bench", is_staff=True)
    image = services.create_image(actor="bench", name="bench-linux", os="Linux", min_memory_mib=256)
    variant = services.add_variant(
        image, actor="bench", hypervisor_type="sim", format="sim", location="sim://library/bench-linux"
    )
    made = Hypervisor.objects.bulk_create(
        Hypervisor(
            name=f"sim-{i:03d}",
            address=f"sim-{i:03d}.example.org",
            driver="sim",
            cpus=32,
            memory_mib=65536,
            disk_gib=2000,
        )
        for i in range(hosts)
    )
    sim_hosts = {h.name: sim.ensure_host(h.name, reason="bench") for h in made}
    now = timezone.now()
    owners = [made[i % full] for i in range(vms)]
    allocations = Allocation.objects.bulk_create(
        Allocation(host=h, owner=admin, purpose="vm", vcpus=1, memory_mib=memory_mib, disk_gib=10, start=now)
        for h in owners
    )
    rows = VM.objects.bulk_create(
        VM(
            image=image,
            variant=variant,
            host=h,
            allocation=a,
            owner=admin,
            state="running",
            vcpus=1,
            memory_mib=memory_mib,
            disk_gib=10,
        )
        for h, a in zip(owners, allocations, strict=True)
    )
    for vm, a in zip(rows, allocations, strict=True):
        a.purpose = f"vm {vm.pk}"
    Allocation.objects.bulk_update(allocations, ["purpose"])
    SimVM.objects.bulk_create(
        SimVM(
            key=vm_key(vm.pk),
            host=sim_hosts[vm.host.name],
            state="running",
            vcpus=1,
            memory_mib=memory_mib,
            disk_gib=10,
            image="bench-linux",
            image_format="sim",
            network="default",
            fingerprint="bench",
        )
        for vm in rows
    )
    return admin, made


def start_workers(workers):
    from monitoring.health import live_worker_count

    log = open(Path(os.environ["VCLMGR_VAR_DIR"]) / "qcluster.log", "wb")  # noqa: SIM115 (kept open for the child)
    child = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VCLMGR_WORKERS": str(workers), "LOG_LEVEL": "WARNING"},
        start_new_session=True,
    )
    wait_for(lambda: live_worker_count() >= workers, 60, "the workers")
    return child


def peak_running(rows):
    from tests.jobs.helpers import max_overlap  # the job tests' measure (ROOT is on the path by now)

    return max_overlap(rows)


def run_plan(plan, admin, timeout=3600):
    from jobs.models import Job
    from provisioning import plans

    start = time.monotonic()
    plans.execute(plan, actor=admin)
    ids = [m["job"] for m in plan.__class__.objects.get(pk=plan.pk).moves]
    wait_for(lambda: not Job.objects.filter(pk__in=ids).exclude(status__in=Job.FINAL).exists(), timeout, "the moves")
    elapsed = time.monotonic() - start
    rows = list(Job.objects.filter(pk__in=ids))
    failed = [r.error_message for r in rows if r.status != "success"]
    return elapsed, rows, failed


def evacuate(args):
    from django.core.management import call_command

    from provisioning import plans
    from provisioning.models import VM

    call_command("migrate", verbosity=0)
    # The VMs must fit on the one host (64 GiB, memory ratio 1): 100 VMs of 512 MiB.
    admin, hosts = seed(11, 1, args.evacuate_vms, memory_mib=min(1024, 65536 // max(1, args.evacuate_vms) // 256 * 256))
    worker = start_workers(args.workers)
    try:
        t0 = time.monotonic()
        plan = plans.compute("evacuate-node", actor=admin, target=hosts[0].name, reason="rate-limit:4:bench")
        plan_s = time.monotonic() - t0
        elapsed, rows, failed = run_plan(plan, admin)
        left = VM.objects.filter(host=hosts[0], state__in=VM.LIVE).count()
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    return {
        "vms": args.evacuate_vms,
        "vm_memory_mib": VM.objects.first().memory_mib,
        "moves": len(plan.moves),
        "plan_s": round(plan_s, 2),
        "empty_after_s": round(elapsed, 2),
        "peak_running": peak_running(rows),
        "left_on_host": left,
        "failed": len(failed),
        "first_error": failed[0][:200] if failed else "",
    }


def hbal(args):
    from django.core.management import call_command

    from placement.ganeti import text_backend
    from provisioning import plans

    call_command("migrate", verbosity=0)
    admin, _ = seed(args.hosts, args.hosts // 2, args.vms)
    limit = args.max_moves if args.max_moves > 0 else -1
    t0, c0 = time.monotonic(), time.process_time()
    plan = plans.compute("balance", actor=admin, options={"max_moves": limit})
    plan_s, plan_cpu = time.monotonic() - t0, time.process_time() - c0
    path = Path(os.environ["VCLMGR_VAR_DIR"]) / "cluster.txt"
    path.write_text(text_backend.serialize(plans.live().gcluster))
    bound = ["-l", str(limit)] if limit > 0 else []
    # Ganeti's binaries where bench/placement_core.py finds them, and our htools command.
    from bench._ganeti_side_by_side import htools_command, tool

    ganeti_hbal = tool("hbal")
    ganeti = (
        _timed([ganeti_hbal, "-t", str(path), *bound], args.ganeti_timeout)
        if ganeti_hbal
        else ("not installed (make's test tools: ganeti-htools-3.0)", None, None)
    )
    bound = ["--max-moves", str(limit)] if limit > 0 else []
    ours = _timed([htools_command(), "hbal", "--ganeti-file", str(path), *bound], args.ganeti_timeout)
    worker = start_workers(args.workers)
    try:
        elapsed, rows, failed = run_plan(plan, admin)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    return {
        "hosts": args.hosts,
        "vms": args.vms,
        "moves": len(plan.moves),
        "score": round(plan.score_before, 4),
        "max_moves": limit if limit > 0 else "converge",
        "after": round(plan.score_after, 4),
        "plan_s": round(plan_s, 2),
        "plan_cpu_s": round(plan_cpu, 2),
        "ganeti_hbal_file_s": ganeti[0],
        "ganeti_cpu_s": ganeti[2],
        "ganeti_moves": ganeti[1],
        "our_hbal_file_s": ours[0],
        "our_cpu_s": ours[2],
        "our_file_moves": ours[1],
        "execute_s": round(elapsed, 2),
        "peak_running": peak_running(rows),
        "failed": len(failed),
        "live_score": round(plans.live_score(plan.options.get("score_group")), 4),
    }


def _timed(argv, timeout):
    """(wall seconds, moves, CPU seconds) of a whole process; a run past ``timeout`` is killed
    and reported as such, with the moves it had printed."""
    start = time.monotonic()
    before = os.times()
    child = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        after = os.times()
        printed = sum(1 for line in stdout.splitlines() if "=>" in line)
        cpu = round(after.children_user + after.children_system - before.children_user - before.children_system, 2)
        return f"timeout after {timeout}s", f"{printed} printed", cpu
    after = os.times()
    cpu = round(after.children_user + after.children_system - before.children_user - before.children_system, 2)
    if child.returncode:
        return f"failed: {stderr.strip()[-200:]}", None, cpu
    moves = next((line.split("=")[1] for line in stdout.splitlines() if line.startswith("Solution length=")), "?")
    return round(time.monotonic() - start, 2), moves, cpu


def one(args):
    setup_django()
    result = evacuate(args) if args.one == "evacuate" else hbal(args)
    print(json.dumps(result), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--evacuate-vms", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--vms", type=int, default=2000)
    parser.add_argument(
        "--max-moves", type=int, default=0, help="hbal: at most N moves on both sides (Ganeti's -l N); 0: converge"
    )
    parser.add_argument("--ganeti-timeout", type=int, default=900, help="hbal: cap of each whole-process run (s)")
    parser.add_argument("--only", choices=("evacuate", "hbal"), help="run one of the two")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): does it run?")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.smoke:
        args.evacuate_vms, args.hosts, args.vms = 10, 10, 40
    if args.one:
        one(args)
        return
    for label in (args.only,) if args.only else ("evacuate", "hbal"):
        with tempfile.TemporaryDirectory(prefix="vclmgr-bench-") as var:
            env = child_env(var, label)
            sizes = [
                "--evacuate-vms",
                str(args.evacuate_vms),
                "--hosts",
                str(args.hosts),
                "--vms",
                str(args.vms),
                "--max-moves",
                str(args.max_moves),
                "--ganeti-timeout",
                str(args.ganeti_timeout),
            ]
            command = [sys.executable, __file__, "--one", label, "--workers", str(args.workers), *sizes]
            print(f"running {label} …", file=sys.stderr, flush=True)
            result = run_child(command, env, label)
            print(f"{label}: " + ", ".join(f"{k} {v}" for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main()
