"""Several machines under load: throughput, reserve-to-ready and API latency at 1 and 3 worker machines.

    python bench/topology.py [--hosts 200] [--students 30] [--admins 2] [--cycles 2] [--spawn-rate 2]
                             [--worker-machines 1,3] [--faults | --no-faults] [--seed N] [--smoke]

Runs ``tools/topology`` (the machinery of ``tests/integration/test_topology.py``: network
namespaces for a database machine with its own PostgreSQL and Redis, two web machines behind
haproxy, the worker machines, a client machine running locust) once per ``--worker-machines``
count on a sim cluster of ``--hosts`` hosts with the realistic step delays, and prints per run:
reservations ready per second, p50/p99 reserve-to-ready (POST answered → the ready event on
the student's socket), API latency p50/p99 (reserve, extend, end, the dashboard's data) and
CPU seconds per ready reservation by role (web, worker, db, lb, client). With ``--faults``
(default) the last run also has the five faults, and its invariants table is printed; the
scaling runs go without faults so that they measure capacity, not recovery. Needs root.
On 2 cores the wall-clock gain of 3 worker machines over 1 is bounded by the CPU the whole
topology shares; CPU per reservation is the figure that carries to bigger machines.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.topology import report, scenario  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--admins", type=int, default=2)
    parser.add_argument("--spawn-rate", type=float, default=2.0, help="students signing in per second")
    parser.add_argument("--cycles", type=int, default=2, help="reservations per student, one after the other")
    parser.add_argument("--worker-machines", default="1,3", help="comma-separated counts, one run each")
    parser.add_argument("--workers-per-machine", type=int, default=3)
    parser.add_argument("--faults", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--smoke", action="store_true", help="the test's small numbers (a few minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the logs' folder")
    args, _ = parser.parse_known_args()  # run_all.py passes every benchmark the same arguments
    if os.geteuid() != 0:
        sys.exit("bench/topology.py makes network namespaces: run it as root")
    counts = [int(n) for n in args.worker_machines.split(",") if n]
    runs = [(n, False) for n in counts] + ([(max(counts), True)] if args.faults else [])
    results = []
    for worker_machines, faults in runs:
        work = tempfile.mkdtemp(prefix="vclmgr-bench-topology-")
        config = scenario.Config(workdir=work, worker_machines=worker_machines, faults=faults)
        if not args.smoke:
            config.hosts, config.students, config.admins, config.cycles = (
                args.hosts,
                args.students,
                args.admins,
                args.cycles,
            )
            config.workers_per_machine = args.workers_per_machine
            config.limit = max(config.limit, worker_machines * args.workers_per_machine * 2)
            config.spawn_rate, config.time_limit, config.fault_window = args.spawn_rate, 900, (20.0, 90.0)
        if args.seed is not None:
            config.seed = args.seed
        print(
            f"== {worker_machines} worker machine(s), faults {'on' if faults else 'off'}, seed {config.seed}, "
            f"logs in {work}",
            flush=True,
        )
        result = scenario.run(config)
        results.append(result)
        print(json.dumps({"worker_machines": worker_machines, "faults": faults, **result["figures"]}), flush=True)
        if faults:
            print(report.faults(result))
        print(report.invariants(result), flush=True)
    print(report.figures(results))
    if not all(check["ok"] for result in results for check in result["checks"].values()):
        sys.exit("an invariant failed")


if __name__ == "__main__":
    main()
