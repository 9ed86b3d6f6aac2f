"""``hbal`` prints Ganeti's hbal text byte for byte: the same stdout as the real binary on the
benchmark's cases (the planner's own functions are unchanged for their other callers)."""

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from placement.ganeti import text_backend
from placement.ganeti.generate import unbalanced_cluster
from placement.ganeti.hbal import HbalOptions, MoveStep, balance, ganeti_float, job_sets
from tests.placement.helpers import ganeti_tool, htools_command

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "placement" / "ganeti"


def ours(*args):
    """``htools hbal ARGS`` as a user runs it (no Django for a file), Ganeti's own path."""
    done = subprocess.run(
        [htools_command(), "hbal", *args, "--strategy", "steepest"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def theirs(*args):
    done = subprocess.run([ganeti_tool("hbal"), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def bench_16_nodes(tmp_path) -> Path:
    """The benchmark's ``hbal 16 nodes / 160 drbd`` file (bench/_ganeti_side_by_side.hbal_file)."""
    path = tmp_path / "hbal-16.txt"
    path.write_text(text_backend.serialize(unbalanced_cluster(16, 160, seed=16)))
    return path


@pytest.mark.parametrize(
    "name", ["drbd-8-nodes.txt", "ext-6-nodes.txt", "mixed-states.txt", "forthcoming.txt", "two-minmax-specs.txt"]
)
@pytest.mark.parametrize("flags", [[], ["-C"]], ids=["plain", "commands"])
def test_stdout_is_ganetis_on_the_sample_files(name, flags):
    # drbd-8: the bench case; ext-6: job sets of migrations; mixed-states: offline/drained
    # nodes; two-minmax-specs: no instances ("Cluster is empty").
    args = ["-t", str(DATA / name), *flags]
    assert ours(*args) == theirs(*args)


def test_stdout_is_ganetis_on_the_benchmarks_16_node_file(tmp_path):
    # One node violates the vCPU policy: hbal's "policy-violating nodes" lines.
    args = ["-t", str(bench_16_nodes(tmp_path)), "-C"]
    text = theirs(*args)
    assert "policy-violating" in text
    assert ours(*args) == text


def test_a_move_limit_and_no_moves_print_as_ganeti(tmp_path):
    path = str(DATA / "drbd-8-nodes.txt")
    assert ours("-t", path, "--max-moves=4", "-C") == theirs("-t", path, "--max-length=4", "-C")
    text = ours("-t", path, "--max-moves=0", "-C")
    assert "No solution found\nSolution length=0\n\nCommands to run" in text
    assert text == theirs("-t", path, "--max-length=0", "-C")


def test_the_command_script_is_ganetis(tmp_path):
    path = str(DATA / "ext-6-nodes.txt")
    mine, ganetis = tmp_path / "ours.sh", tmp_path / "theirs.sh"
    out = ours("-t", path, f"--print-commands={mine}")
    assert out.endswith(f"The commands have been written to file '{mine}'\n")
    assert out.replace(str(mine), "F") == theirs("-t", path, f"-C{ganetis}").replace(str(ganetis), "F")
    assert mine.read_text() == ganetis.read_text()


def test_the_management_command_prints_the_same(capsys):
    path = str(DATA / "drbd-8-nodes.txt")
    call_command("hbal", "-t", path, "--strategy", "steepest", "-C")
    assert capsys.readouterr().out == theirs("-t", path, "-C")


def test_job_sets_are_split_from_the_newest_move_back_as_ganeti_does():
    def step(name, old, new):
        return MoveStep(name, "f", old, new, 0.0, [])

    a, b, c = step("a", ("n1", "n2"), ("n2", "n1")), step("b", ("n3",), ("n4",)), step("c", ("n1",), ("n5",))
    # From the newest: c, then b (disjoint) join it; a touches n1: a set of its own, first.
    assert [[s.instance for s in js] for js in job_sets([a, b, c])] == [["a"], ["b", "c"]]


@pytest.mark.parametrize(
    "value, text",
    [
        (12.68024006, "12.68024006"),
        (2.123456785, "2.12345678"),
        (2.123456775, "2.12345678"),
        (1.5e-08, "0.00000002"),
        (5e-09, "0.00000000"),
        (9.999999995, "10.00000000"),
        (0.0, "0.00000000"),
    ],
)
def test_scores_round_as_haskells_printf(value, text):
    # GHC rounds the shortest digits half to even; C rounds the binary value (2.12345679 here).
    assert ganeti_float(value) == text


def test_the_planner_keeps_its_own_interface():
    cluster = text_backend.parse((DATA / "drbd-8-nodes.txt").read_text())
    result = balance(cluster, HbalOptions(strategy="steepest", max_moves=1))
    assert result.steps[0].line(1).startswith("   1. inst0039 node000:node004 => node003:node004 ")
    assert result.commands()[0] == "gnt-instance migrate -f inst0039"


@pytest.mark.parametrize("group", ["group-01", "fake-uuid-02"])
def test_one_group_of_several_prints_as_ganeti(tmp_path, group):
    sections = (DATA / "two-minmax-specs.txt").read_text().split("\n\n")
    sections[2] = "i1|1024|1024|1|running|Y|node-01-001||ext||1|-|N\ni2|1024|1024|1|running|Y|node-01-001||ext||1|-|N"
    path = tmp_path / "two-groups.txt"
    path.write_text("\n\n".join(sections))
    assert ours("-t", str(path), "-G", group, "-C") == theirs("-t", str(path), "-G", group, "-C")


def test_the_same_flags_print_the_same_text(tmp_path):
    # No --strategy: the default is Ganeti's path ("auto" may keep a better lazy end instead).
    # manage.py: a file read through Django (htools answers it without) prints the same.
    path = str(DATA / "drbd-8-nodes.txt")
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "hbal", "-t", path, "-C"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.stdout == theirs("-t", path, "-C")
