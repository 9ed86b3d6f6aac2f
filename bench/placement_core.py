"""Placement benchmark: prints a table of its figures.

    python bench/placement_core.py            # full run (minutes: Ganeti's tools are slow)
    python bench/placement_core.py --quick    # smaller sizes, a minute or two
    python bench/placement_core.py --smoke    # tiny sizes, seconds: does it still run?
    python bench/placement_core.py --only hbal,vcl   # some sections only

Sections (``--only``): one placement among 10,000 hosts holding 100,000 time-windowed
allocations (p50/p99, pure core); 10,000 consecutive placements (rate); hspace and hbal side
by side with Ganeti's binaries on the same clusters; Ganeti's commands as whole processes, and
answered in this process (the API's path) against Ganeti's process; VCL static slots against
resource-based placement on one blade center. The database claim is measured elsewhere.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import _ganeti_side_by_side as side  # noqa: E402
from bench import _placement_workloads as work  # noqa: E402
from placement import PlacementEngine, PlacementOptions  # noqa: E402


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print(f"\n== {title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def bench_single(hosts: int, allocs: int, samples: int) -> list[list[str]]:
    start = time.perf_counter()
    cluster = work.big_cluster(hosts, allocs)
    gen_s = time.perf_counter() - start
    rows = []
    for policy in ("balanced", "pack"):
        start = time.perf_counter()
        engine = PlacementEngine(cluster, PlacementOptions(default_policy=policy))
        engine.warm()
        build_s = time.perf_counter() - start
        timings, cpu, placed = [], [], 0
        for r in work.requests(samples, cluster.now):
            t0, c0 = time.perf_counter(), time.process_time()
            result = engine.place(r)
            cpu.append(time.process_time() - c0)
            timings.append(time.perf_counter() - t0)
            placed += result.ok
        rows.append(
            [
                f"{hosts} hosts / {allocs} allocations, {policy}",
                f"{statistics.median(timings) * 1e3:.2f} ms",
                f"{percentile(timings, 99) * 1e3:.2f} ms",
                f"{statistics.median(cpu) * 1e3:.2f} / {percentile(cpu, 99) * 1e3:.2f} ms",
                f"{placed}/{samples} placed",
                f"engine build + warm {build_s:.1f}s (generate {gen_s:.1f}s)",
            ]
        )
    return rows


def bench_consecutive(hosts: int, allocs: int, count: int) -> list[list[str]]:
    cluster = work.big_cluster(hosts, allocs, seed=5)
    rows = []
    for policy in ("balanced", "pack"):
        engine = PlacementEngine(cluster, PlacementOptions(default_policy=policy))
        engine.warm()
        reqs = work.requests(count, cluster.now, seed=6, prefix=f"{policy}-")
        start, cpu_start = time.perf_counter(), time.process_time()
        placed = 0
        for r in reqs:
            result = engine.place(r)
            if result.ok:
                engine.commit(result)
                placed += 1
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        rows.append(
            [
                f"{count} placements into {hosts}/{allocs}, {policy}",
                f"{count / elapsed:,.0f}/s",
                f"{count / cpu:,.0f}/s",
                f"{placed} placed",
                f"{elapsed:.2f}s",
            ]
        )
    return rows


def bench_vcl(blades: int, reservations: int) -> list[list[str]]:
    center = work.blade_center(blades)
    reqs = work.lab_workload(reservations)
    largest = max(work.IMAGES, key=lambda i: i[1])[:3]
    typical = work.IMAGES[1][:3]
    rows = []
    slot_counts = {}
    for label, slot in (("largest image", largest), ("typical image", typical)):
        slot_counts[label] = work.vcl_static_slots(center, reqs, slot)
    for policy in ("pack", "balanced"):
        engine = PlacementEngine(center, PlacementOptions(default_policy=policy, earliest_fit=False))
        accepted = 0
        for r in reqs:
            result = engine.place(r)
            if result.ok:
                engine.commit(result)
                accepted += 1
        for label, count in slot_counts.items():
            gain = (accepted - count) / count * 100 if count else float("inf")
            rows.append(
                [
                    f"{blades} blades, {reservations} reservations",
                    f"VCL slots sized for the {label}: {count}",
                    f"vclmgr {policy}: {accepted}",
                    f"+{gain:.0f}%",
                ]
            )
    return rows


SECTIONS = ("single", "consecutive", "hspace", "hbal", "process", "inprocess", "vcl")

#: (hosts, allocations, samples, consecutive placements, hspace nodes, hbal runs, VCL
#: reservations) per size. hbal runs: (nodes, instances, our strategies, move cap or -1).
# steepest takes hbal's own path (checked in the tests). Ganeti's hbal takes minutes to
# converge on 30 nodes / 300 instances here and hours on 100 / 1,000 (about 40 s a move),
# so the larger run compares the first moves only.
_BOTH = ("lazy", "steepest")
SIZES = {
    "full": (
        10000, 100000, 2000, 10000, (10, 30, 100),
        ((10, 100, _BOTH, -1), (30, 300, _BOTH, -1), (100, 1000, ("steepest",), 5)), 6000,
    ),
    "quick": (2000, 20000, 300, 2000, (10, 20), ((10, 100, _BOTH, -1),), 3000),
    "smoke": (200, 2000, 50, 200, (10,), ((6, 40, _BOTH, -1),), 300),
}  # fmt: skip


def process_cases(mode: str, tmp: str) -> list:
    """Whole processes, as a user runs them: ``htools hspace|hbal`` (no Django for a file
    or a simulation) against Ganeti's binary, the same arguments, several runs each."""
    sim = "--disk-template=plain --tiered-alloc=102400,16384,8 --standard-alloc=20480,4096,2 --machine-readable"
    chain = "--disk-template=plain --standard-alloc=10240,1024,1 --tiered-alloc=102400,8192,4 --machine-readable"
    C = side.ProcessCase
    cases = [
        C("hspace mixed-states.txt (tiered chain)", "hspace", ["-t", f"{side.DATA}/mixed-states.txt", *chain.split()]),
        C(
            "hspace two-minmax-specs.txt",
            "hspace",
            ["-t", f"{side.DATA}/two-minmax-specs.txt", "--disk-template=file", "--machine-readable"],
        ),
        C(
            "hspace 3 nodes drbd (seed)",
            "hspace",
            [
                "--simulate=p,3,34052480,65523,24",
                "--disk-template=drbd",
                "--tiered-alloc=1048576,1024,8",
                "--machine-readable",
            ],
        ),
        C("hbal drbd-8-nodes.txt", "hbal", ["-t", f"{side.DATA}/drbd-8-nodes.txt"], ("--strategy", "steepest")),
    ]
    if mode == "smoke":
        return cases
    cases += [
        C("hspace 10 nodes", "hspace", ["--simulate=p,10,2000000,131072,32", *sim.split()]),
        C(
            "hspace 20 nodes (no N+1)",
            "hspace",
            ["--simulate=p,20,2000000,131072,32", *sim.split(), "--no-capacity-checks"],
        ),
        C("hbal 16 nodes / 160 drbd", "hbal", ["-t", side.hbal_file(16, 160, tmp)], ("--strategy", "steepest"), 3),
    ]
    if mode == "full":
        cases.append(
            C(
                "hspace 30 nodes (no N+1)",
                "hspace",
                ["--simulate=p,30,2000000,131072,32", *sim.split(), "--no-capacity-checks"],
                runs=3,
            )
        )
    return cases


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes (a minute or two)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): does it run?")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    only = set(args.only.split(","))
    if only - set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(only - set(SECTIONS)))}")
    hosts, allocs, samples, count, hspace_sizes, hbal_runs, reservations = SIZES[mode]
    ganeti_timeout = {"full": 900, "quick": 300, "smoke": 60}[mode]
    print(
        f"vclmgr placement benchmark ({mode}), python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {_load()} (wall times stretch under load; "
        "CPU times less so)"
    )
    if "single" in only:
        table(
            "one placement (pure core, engine built once)",
            ["cluster", "p50", "p99", "CPU p50 / p99", "result", "setup"],
            bench_single(hosts, allocs, samples),
        )
        print(f"load average {_load()}")
    if "consecutive" in only:
        table(
            "consecutive placements (place + commit)",
            ["run", "rate", "CPU-time rate", "placed", "time"],
            bench_consecutive(hosts, allocs, count),
        )
        print(f"load average {_load()}")
    if "hspace" in only:
        rows = [side.hspace_row(n, capacity=n <= 10, timeout=min(ganeti_timeout, 600)) for n in hspace_sizes]
        _side_table("hspace: instances placed (tiered / standard), same input", rows)
    if "hbal" in only:
        rows = [
            row
            for n, i, strategies, cap in hbal_runs
            for row in side.hbal_rows(n, i, timeout=ganeti_timeout, strategies=strategies, max_moves=cap)
        ]
        _side_table("hbal: final `hinfo --ignore-dynu` score (lower is better), same input", rows)
    if "process" in only:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [side.process_row(case, ganeti_timeout) for case in process_cases(mode, tmp)]
        _process_table(rows)
    if "inprocess" in only:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [side.inprocess_row(case, ganeti_timeout) for case in process_cases(mode, tmp)]
        _process_table(rows, "in this process (the API's and CLI's path): htools (ours) against Ganeti's binary")
    if "vcl" in only:
        table(
            "VCL static slots vs resource-based placement (accepted reservations)",
            ["workload", "VCL", "vclmgr", "gain"],
            bench_vcl(14, reservations),
        )


def _side_table(title: str, rows) -> None:
    table(
        title,
        ["run", "vclmgr", "Ganeti", "vclmgr s", "Ganeti s", "speed-up (wall, CPU)", "note"],
        [[r.label, r.ours, r.theirs, f"{r.ours_s:.2f}", _s(r.theirs_s), r.ratio, r.note] for r in rows],
    )
    print(f"load average {_load()}")


def _process_table(rows, title="whole processes: htools (ours) against Ganeti's binary") -> None:
    """CPU time of whole processes, best of N and median; the ratio is Ganeti's best over
    ours (above 1.0: ours is faster)."""

    def ms(values) -> str:
        return f"{min(values) * 1e3:.0f} / {statistics.median(values) * 1e3:.0f}" if values else "-"

    lines = []
    for r in rows:
        ratio = r.ratio
        verdict = "-" if ratio is None else f"{ratio:.2f}x" + ("" if ratio >= 1.0 else "  SLOWER")
        runs = max(len(r.ours), len(r.theirs or ()))
        lines.append([r.label, ms(r.ours), ms(r.theirs), verdict, f"{r.note}; {runs} runs"])
    table(
        f"{title}, CPU ms (user + system)",
        ["run", "ours best / median", "Ganeti best / median", "speed vs Ganeti (best)", "note"],
        lines,
    )
    slower = [r.label for r in rows if r.ratio is not None and r.ratio < 1.0]
    print("slower than Ganeti: " + (", ".join(slower) if slower else "none"))
    print(f"load average {_load()}")


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
