"""Run Ganeti's hspace/hbal/hinfo and ours on the same clusters (bench/placement.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

from provisioning.placement.ganeti import text_backend
from provisioning.placement.ganeti.generate import consistent_free_memory, unbalanced_cluster
from provisioning.placement.ganeti.hbal import balance
from provisioning.placement.ganeti.hspace import HSpaceOptions, Spec, run_hspace
from provisioning.placement.ganeti.simulate import simulated_cluster

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

    @property
    def ratio(self) -> str:
        if self.theirs_s is None:
            return "-"
        return f"{self.theirs_s / max(self.ours_s, 1e-9):.1f}x"


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
    start = time.perf_counter()
    result = run_hspace(
        simulated_cluster([spec]),
        HSpaceOptions(
            disk_template="plain",
            tiered=Spec.parse("102400,16384,8"),
            standard=Spec.parse("20480,4096,2"),
            capacity=capacity,
        ),
    )
    ours_s = time.perf_counter() - start
    ours = f"tiered {len(result.tiered_placed)}, std {result.standard_count}"
    lines, theirs_s = _run([tool("hspace"), "--machine-readable", *args], timeout)
    if lines is None:
        return Row(f"hspace {nodes} nodes", ours, f"no answer in {timeout:.0f}s", ours_s, None)
    keys = dict(line.split("=", 1) for line in lines.splitlines() if "=" in line)
    theirs = f"tiered {keys.get('HTS_TRL_INST_CNT')}, std {keys.get('HTS_ALLOC_INSTANCES')}"
    same = result.hts_lines() == lines.splitlines()
    return Row(
        f"hspace {nodes} nodes" + ("" if capacity else " (no N+1)"),
        ours,
        theirs,
        ours_s,
        theirs_s,
        "identical HTS_ output" if same else "output differs",
    )


def _run(argv, timeout: float):
    if argv[0] is None:
        return None, None
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, None
    return done.stdout, time.perf_counter() - start


def _hinfo(path: str) -> float | None:
    out, _ = _run([tool("hinfo"), "-t", path, "--ignore-dynu"], 120)
    if not out:
        return None
    return float(out.strip().splitlines()[-1].split()[-1])


def hbal_row(nodes: int, instances: int, timeout: float) -> Row:
    cluster = unbalanced_cluster(nodes, instances, seed=nodes)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.txt")
        with open(src, "w") as handle:
            handle.write(text_backend.serialize(cluster))
        start = time.perf_counter()
        result = balance(text_backend.parse(open(src).read(), ignore_dynu=True))
        ours_s = time.perf_counter() - start
        ours_path = os.path.join(tmp, "ours.txt")
        with open(ours_path, "w") as handle:
            handle.write(text_backend.serialize(consistent_free_memory(result.cluster)))
        ours_score = _hinfo(ours_path)
        ours = f"{ours_score:.4f} in {len(result.steps)} moves"
        out, theirs_s = _run(
            [tool("hbal"), "-t", src, "--ignore-dynu", "-S", os.path.join(tmp, "g")], timeout
        )
        label = f"hbal {nodes} nodes / {len(cluster.instances)} drbd"
        if out is None:
            return Row(label, ours, f"no answer in {timeout:.0f}s", ours_s, None)
        moves = sum(1 for line in out.splitlines() if " a=" in line)
        saved = text_backend.parse(open(os.path.join(tmp, "g.balanced")).read())
        theirs_path = os.path.join(tmp, "theirs.txt")
        with open(theirs_path, "w") as handle:
            handle.write(text_backend.serialize(consistent_free_memory(saved)))
        theirs_score = _hinfo(theirs_path)
        theirs = f"{theirs_score:.4f} in {moves} moves"
        verdict = "ours better or equal" if ours_score <= theirs_score + 1e-9 else "ours worse"
        return Row(
            label, ours, theirs, ours_s, theirs_s, f"start {result.initial_score:.2f}; {verdict}"
        )
