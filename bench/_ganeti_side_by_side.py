"""Run Ganeti's hspace/hbal/hinfo and ours on the same clusters (bench/placement_core.py)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from placement.ganeti import text_backend
from placement.ganeti.generate import consistent_free_memory, unbalanced_cluster
from placement.ganeti.hbal import HbalOptions, balance
from placement.ganeti.hspace import HSpaceOptions, Spec, run_hspace
from placement.ganeti.simulate import simulated_cluster

GANETI_BIN = os.environ.get("GANETI_BIN", "/usr/lib/ganeti/3.0/usr/bin")


def tool(name: str) -> str | None:
    path = os.path.join(GANETI_BIN, name)
    return path if os.access(path, os.X_OK) else shutil.which(name)


@dataclass
class Row:
    label: str
    ours: str
    theirs: str
    ours_s: float
    theirs_s: float | None
    note: str = ""
    #: CPU seconds (ours: this process; Ganeti: the child): steadier than wall time on a
    #: loaded machine.
    ours_cpu: float | None = None
    theirs_cpu: float | None = None

    @property
    def ratio(self) -> str:
        if self.theirs_s is None:
            return "-"
        wall = f"{self.theirs_s / max(self.ours_s, 1e-9):.1f}x"
        if self.ours_cpu is None or self.theirs_cpu is None:
            return wall
        return f"{wall} (CPU {self.theirs_cpu / max(self.ours_cpu, 1e-9):.1f}x)"


class _Timer:
    """Wall and CPU time of a block run in this process."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def hspace_row(nodes: int, capacity: bool, timeout: float) -> Row:
    spec = f"p,{nodes},2000000,131072,32"
    args = [
        f"--simulate={spec}",
        "--disk-template=plain",
        "--tiered-alloc=102400,16384,8",
        "--standard-alloc=20480,4096,2",
    ]
    if not capacity:
        args.append("--no-capacity-checks")
    with _Timer() as ours_t:
        result = run_hspace(
            simulated_cluster([spec]),
            HSpaceOptions(
                disk_template="plain",
                tiered=Spec.parse("102400,16384,8"),
                standard=Spec.parse("20480,4096,2"),
                capacity=capacity,
            ),
        )
    ours = f"tiered {len(result.tiered_placed)}, std {result.standard_count}"
    label = f"hspace {nodes} nodes" + ("" if capacity else " (no N+1)")
    lines, theirs_s, theirs_cpu = _run([tool("hspace"), "--machine-readable", *args], timeout)
    if lines is None:
        return Row(label, ours, f"no answer in {timeout:.0f}s", ours_t.wall, None, "", ours_t.cpu)
    keys = dict(line.split("=", 1) for line in lines.splitlines() if "=" in line)
    theirs = f"tiered {keys.get('HTS_TRL_INST_CNT')}, std {keys.get('HTS_ALLOC_INSTANCES')}"
    same = result.hts_lines() == lines.splitlines()
    note = "identical HTS_ output" if same else "output differs"
    return Row(label, ours, theirs, ours_t.wall, theirs_s, note, ours_t.cpu, theirs_cpu)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(argv, timeout: float):
    """``(stdout, wall seconds, CPU seconds)``, or Nones when missing or timed out."""
    if argv[0] is None:
        return None, None, None
    start, cpu = time.perf_counter(), _children_cpu()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, None, None
    return done.stdout, time.perf_counter() - start, _children_cpu() - cpu


def _hinfo(path: str) -> float | None:
    out, _, _ = _run([tool("hinfo"), "-t", path, "--ignore-dynu"], 120)
    if not out:
        return None
    return float(out.strip().splitlines()[-1].split()[-1])


def hbal_rows(
    nodes: int,
    instances: int,
    timeout: float,
    strategies: tuple[str, ...] = ("lazy",),
    max_moves: int = -1,
) -> list[Row]:
    """One Ganeti hbal run against ours with each strategy, on the same generated file.
    ``max_moves`` caps both (Ganeti's ``-l``): on clusters where Ganeti would take hours
    to converge, the first moves still compare speed and path."""
    cluster = unbalanced_cluster(nodes, instances, seed=nodes)
    label = f"hbal {nodes} nodes / {len(cluster.instances)} drbd"
    cap = []
    if max_moves >= 0:
        label += f", first {max_moves} moves"
        cap = ["-l", str(max_moves)]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.txt")
        with open(src, "w") as handle:
            handle.write(text_backend.serialize(cluster))
        out, theirs_s, theirs_cpu = _run(
            [tool("hbal"), "-t", src, "--ignore-dynu", *cap, "-S", os.path.join(tmp, "g")], timeout
        )
        theirs_score = None
        if out is not None:
            moves = sum(1 for line in out.splitlines() if " a=" in line)
            saved = text_backend.parse(open(os.path.join(tmp, "g.balanced")).read())
            theirs_path = os.path.join(tmp, "theirs.txt")
            with open(theirs_path, "w") as handle:
                handle.write(text_backend.serialize(consistent_free_memory(saved)))
            theirs_score = _hinfo(theirs_path)
            theirs = f"{theirs_score:.4f} in {moves} moves"
        else:
            theirs = f"no answer in {timeout:.0f}s"
        rows = []
        for strategy in strategies:
            with _Timer() as ours_t:
                result = balance(
                    text_backend.parse(open(src).read(), ignore_dynu=True),
                    HbalOptions(strategy=strategy, max_moves=max_moves),
                )
            ours_path = os.path.join(tmp, f"ours-{strategy}.txt")
            with open(ours_path, "w") as handle:
                handle.write(text_backend.serialize(consistent_free_memory(result.cluster)))
            ours_score = _hinfo(ours_path)
            ours = f"{ours_score:.4f} in {len(result.steps)} moves"
            note = f"{strategy}; start {result.initial_score:.2f}"
            if theirs_score is not None:
                better = ours_score <= theirs_score + 1e-9
                note += "; ours better or equal" if better else "; ours worse"
            rows.append(Row(label, ours, theirs, ours_t.wall, theirs_s, note, ours_t.cpu, theirs_cpu))
        return rows


# ---------------------------------------------------------------------- whole processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "placement", "ganeti")


def htools_command() -> str:
    """Our ``htools`` (pyproject's console script, beside the interpreter), as a user runs it."""
    path = os.path.join(os.path.dirname(sys.executable), "htools")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"{path} is missing: run make install-dev (it installs the project's htools command)")
    return path


@dataclass
class ProcessCase:
    """One command line given to Ganeti's tool and to our ``htools`` (``ours_extra``: our
    flags on top, e.g. hbal's ``--strategy steepest``, Ganeti's own path)."""

    label: str
    tool: str
    args: list[str]
    ours_extra: tuple[str, ...] = ()
    runs: int = 5


def hbal_file(nodes: int, instances: int, directory: str) -> str:
    path = os.path.join(directory, f"hbal-{nodes}.txt")
    with open(path, "w") as handle:
        handle.write(text_backend.serialize(unbalanced_cluster(nodes, instances, seed=nodes)))
    return path


def _ours_env() -> dict:
    """As installed: byte-compiled modules (this machine's environment turns the cache off,
    which would add the compilation of every module to each run)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # What `htools hbal -t …` imports: capacity's htools and the placement core.
    packages = [os.path.join(ROOT, name) for name in ("capacity", "placement")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], env=env, check=True)
    return env


@dataclass
class ProcessRow:
    """CPU seconds of each run of both processes (user + system, as the kernel counts
    them: load from other processes stretches wall time far more than CPU time)."""

    label: str
    ours: list[float]
    theirs: list[float] | None  # None: Ganeti's tool missing or too slow
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """Ganeti's best CPU time over ours: above 1, ours is faster."""
        if not self.ours or not self.theirs:
            return None
        return min(self.theirs) / max(min(self.ours), 1e-9)


def _run_once(argv, timeout: float, env=None):
    """(stdout, CPU seconds), or (None, None) on a timeout."""
    cpu = _children_cpu()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, None
    return done.stdout, _children_cpu() - cpu


def process_row(case: ProcessCase, timeout: float) -> ProcessRow:
    """``case.runs`` rounds, ours then Ganeti's in each (so both see the same load);
    the first run of each is a warm-up of the file cache, and is not counted."""
    env = _ours_env()
    ours_argv = [htools_command(), case.tool, *case.args, *case.ours_extra]
    theirs_argv = None if tool(case.tool) is None else [tool(case.tool), *case.args]
    ours_out, _ = _run_once(ours_argv, timeout, env)
    if ours_out is None:
        return ProcessRow(case.label, [], None, f"ours: no answer in {timeout:.0f}s")
    theirs_out = None if theirs_argv is None else _run_once(theirs_argv, timeout)[0]
    ours, theirs = [], [] if theirs_out is not None else None
    for _ in range(case.runs):
        ours.append(_run_once(ours_argv, timeout, env)[1])
        if theirs is not None:
            theirs.append(_run_once(theirs_argv, timeout)[1])
    if theirs is None:
        return ProcessRow(case.label, ours, None, "Ganeti: missing or no answer")
    # hbal too: its text is Ganeti's byte for byte (tests/capacity/test_hbal_text.py).
    return ProcessRow(case.label, ours, theirs, "identical stdout" if ours_out == theirs_out else "STDOUT DIFFERS")


def inprocess_row(case: ProcessCase, timeout: float) -> ProcessRow:
    """The same command answered in this process (``capacity.htools.main``, as the API and
    the CLI call it, Python already started and the modules imported) against Ganeti's whole
    process: CPU time of ours per answer, best and median of ``case.runs`` after a warm-up."""
    import contextlib
    import io
    import time

    from capacity import htools

    def answer():
        out = io.StringIO()
        started = time.process_time()
        with contextlib.redirect_stdout(out):
            htools.main([case.tool, *case.args, *case.ours_extra])
        return out.getvalue(), time.process_time() - started

    ours_out, _ = answer()
    ours = [answer()[1] for _ in range(max(case.runs, 5))]
    theirs_argv = None if tool(case.tool) is None else [tool(case.tool), *case.args]
    if theirs_argv is None:
        return ProcessRow(case.label, ours, None, "Ganeti: missing")
    theirs_out = _run_once(theirs_argv, timeout)[0]
    theirs = [_run_once(theirs_argv, timeout)[1] for _ in range(case.runs)]
    return ProcessRow(case.label, ours, theirs, "identical stdout" if ours_out == theirs_out else "STDOUT DIFFERS")
