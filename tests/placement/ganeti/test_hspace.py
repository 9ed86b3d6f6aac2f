"""Capacity planning: our hspace prints what Ganeti's hspace prints, key for key."""

import subprocess
from pathlib import Path

import pytest

from placement.ganeti import text_backend
from placement.ganeti.hspace import HSpaceError, HSpaceOptions, Spec, run_hspace
from placement.ganeti.simulate import simulated_cluster

from ..helpers import ganeti_tool

DATA = Path(__file__).resolve().parents[2] / "data" / "placement" / "ganeti"
SEED = "p,3,34052480,65523,24"


def ganeti_hspace(args):
    out = subprocess.run([ganeti_tool("hspace"), "--machine-readable", *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def ours(cluster, args):
    opts = {}
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "--disk-template":
            opts["disk_template"] = value
        elif key == "--tiered-alloc":
            opts["tiered"] = Spec.parse(value)
        elif key == "--standard-alloc":
            opts["standard"] = Spec.parse(value)
        elif key == "--no-capacity-checks":
            opts["capacity"] = False
    return run_hspace(cluster, HSpaceOptions(**opts)).hts_lines()


def test_the_seed_example_with_plain_disks():
    args = [f"--simulate={SEED}", "--disk-template=plain", "--tiered-alloc=1048576,1024,8"]
    result = run_hspace(
        simulated_cluster([SEED]),
        HSpaceOptions(disk_template="plain", tiered=Spec.parse("1048576,1024,8")),
    )
    # 4 × 24 = 96 vCPUs per node, one for the OS: 11 × 8 + 7 = 95.
    assert result.tspec == "1024,1048576,8,1=33 1024,1048576,7,1=3"
    assert result.tiered_failures[2][1] == 3  # FailCPU on all three nodes
    assert result.standard_count == 96  # 3 × 32 spindle slots
    assert result.fail_reason.label == "FailDisk"
    assert result.hts_lines() == ganeti_hspace(args)


SIMULATIONS = [
    [f"--simulate={SEED}", "--disk-template=drbd", "--tiered-alloc=1048576,1024,8"],
    [f"--simulate={SEED}", "--disk-template=diskless", "--tiered-alloc=1048576,1024,8"],
    [
        "--simulate=p,2,500000,65536,16",
        "--simulate=a,2,100000,32768,8",
        "--disk-template=plain",
        "--tiered-alloc=102400,8192,4",
        "--standard-alloc=10240,1024,1",
    ],
    [
        "--simulate=p,3,100000,65536,4",
        "--simulate=p,3,500000,16384,8,2",
        "--disk-template=sharedfile",
        "--tiered-alloc=102400,8192,8",
        "--standard-alloc=50000,512,2",
    ],
    [
        "--simulate=a,2,500000,100000,8",
        "--disk-template=sharedfile",
        "--tiered-alloc=500000,30000,4",
        "--standard-alloc=50000,2048,1",
    ],
    [
        "--simulate=p,4,2000000,32768,16",
        "--disk-template=file",
        "--tiered-alloc=10240,4096,8",
        "--standard-alloc=10240,512,2",
        "--no-capacity-checks",
    ],
    # bench/placement_core.py's cases: N+1-checked batches placed again from the same state
    # (`_Allocator._chains`), and a shrink chain of 250 levels whose big steps share their
    # sizes (`_Allocator.alloc_fn`).
    [
        "--simulate=p,10,2000000,131072,32",
        "--disk-template=plain",
        "--tiered-alloc=102400,16384,8",
        "--standard-alloc=20480,4096,2",
    ],
    [
        "--simulate=p,20,2000000,131072,32",
        "--disk-template=plain",
        "--tiered-alloc=102400,16384,8",
        "--standard-alloc=20480,4096,2",
        "--no-capacity-checks",
    ],
]


@pytest.mark.parametrize("args", SIMULATIONS, ids=lambda a: " ".join(a[1:3]))
def test_simulated_clusters_match_ganeti(args):
    specs = [a.split("=", 1)[1] for a in args if a.startswith("--simulate=")]
    assert ours(simulated_cluster(specs), args) == ganeti_hspace(args)


@pytest.mark.parametrize(
    "name, args",
    [
        (
            "mixed-states.txt",
            [
                "--disk-template=plain",
                "--standard-alloc=10240,1024,1",
                "--tiered-alloc=102400,8192,4",
            ],
        ),
        ("two-minmax-specs.txt", ["--disk-template=file"]),
    ],
)
def test_text_clusters_match_ganeti(name, args):
    path = DATA / name
    cluster = text_backend.parse(path.read_text())
    assert ours(cluster, args) == ganeti_hspace(["-t", str(path), *args])


def test_a_failing_run_prints_what_ganeti_prints_before_the_error():
    # drbd needs two nodes; Ganeti prints the cluster and initial keys, then exits 1.
    args = [
        "--simulate=p,1,2000000,16384,24",
        "--disk-template=drbd",
        "--tiered-alloc=10240,30000,2",
    ]
    with pytest.raises(HSpaceError, match="Not enough online nodes") as failure:
        ours(simulated_cluster(["p,1,2000000,16384,24"]), args)
    out = subprocess.run([ganeti_tool("hspace"), "--machine-readable", *args], capture_output=True, text=True)
    assert out.returncode == 1 and "Not enough online nodes" in out.stderr
    assert failure.value.lines == out.stdout.splitlines()


def test_human_summary_and_json_agree_with_the_keys():
    result = run_hspace(
        simulated_cluster([SEED]),
        HSpaceOptions(disk_template="plain", tiered=Spec.parse("1048576,1024,8")),
    )
    text = result.summary()
    assert " 33 instances of spec MEM 1024, DSK 1048576, CPU 8" in text
    assert "most likely failure reason: FailCPU" in text
    assert result.to_dict()["standard"]["count"] == 96


def test_forthcoming_instances_count_as_memory_overhead_as_in_ganeti():
    # i1 and i6 are forthcoming: Ganeti keeps them off the nodes' primary lists, so they
    # are not initial instances and their memory is overhead (x_mem); its machine-readable
    # run then stops at the final count check (instances listed != instances on nodes).
    path = DATA / "forthcoming.txt"
    args = ["--disk-template=plain", "--standard-alloc=10240,1024,1", "--tiered-alloc=102400,8192,4"]
    out = subprocess.run(
        [ganeti_tool("hspace"), "--machine-readable", "-t", str(path), *args], capture_output=True, text=True
    )
    assert out.returncode == 1 and "internal inconsistency, allocated (97) != counted (95)" in out.stderr
    theirs = out.stdout.splitlines()
    assert "HTS_INI_INST_CNT=4" in theirs and "HTS_INI_MEM_OVERHEAD=22096" in theirs
    with pytest.raises(HSpaceError, match=r"internal inconsistency, allocated \(97\) != counted \(95\)") as failure:
        ours(text_backend.parse(path.read_text()), args)
    assert failure.value.lines == theirs
