"""Bad input to the Ganeti-compatible commands is a clear error (CommandError, exit 1), never a
traceback or minutes of work on nonsense; where Ganeti's tool defines the answer, ours is it."""

import json
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.placement.helpers import ganeti_tool

DATA = Path(__file__).resolve().parents[1] / "data" / "placement"
TWO_GROUPS = DATA / "ganeti" / "two-minmax-specs.txt"


def ganeti(name, *args):
    return subprocess.run([ganeti_tool(name), *args], capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------- hspace


@pytest.mark.parametrize("mode", ["--machine-readable", None])
def test_hspace_allocation_failure_prints_what_ganeti_prints_then_fails(mode, capsys):
    args = ["--simulate=u,3,100g,64g,8", "--disk-template=plain"] + ([mode] if mode else [])
    with pytest.raises(CommandError, match="^failure during allocation: No online nodes$"):
        call_command("hspace", *args)
    theirs = ganeti("hspace", *args)
    assert theirs.returncode == 1
    assert "Error: failure during allocation: No online nodes" in theirs.stderr
    assert capsys.readouterr().out.splitlines() == theirs.stdout.splitlines()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--simulate=p,3,100g,64g,8", "--standard-alloc=0,0,0"], "--standard-alloc: disk must be at least 1, got 0"),
        (["--simulate=p,3,100g,64g,8", "--tiered-alloc=1024,-128,1"], "--tiered-alloc: memory must be at least 1"),
        (["--simulate=p,3,100g,64g,8", "--standard-alloc=1024,128,0"], "--standard-alloc: CPUs must be at least 1"),
        (["--simulate=p,3,100g,64g,8", "--standard-alloc=1024,128,1,0"], "spindles must be at least 1, got 0"),
        (["--simulate=p,3,100g,64g,8", "--standard-alloc=1024,128,x"], "--standard-alloc: CPUs: cannot parse 'x'"),
        (["--simulate=p,3,100g,64g,0"], "--simulate: number of CPUs must be at least 1, got 0"),
        (["--simulate=p,3,100g,64g,8,0", "--no-capacity-checks"], "--simulate: spindles must be at least 1, got 0"),
        (["--simulate=p,0,100g,64g,8"], "--simulate: node count must be at least 1, got 0"),
        (["--simulate=p,-3,100g,64g,8"], "--simulate: node count must be at least 1, got -3"),
        (["--simulate=p,3,-100,64g,8"], "--simulate: disk size must be at least 1, got -100"),
        (["--simulate=p,3,100g,0,8"], "--simulate: memory size must be at least 1, got 0"),
        (["--simulate=p,x,100g,64g,8"], "--simulate: node count: cannot parse 'x'"),
    ],
)
def test_hspace_refuses_nonsense_specs_up_front(args, message):
    with pytest.raises(CommandError) as failure:
        call_command("hspace", "--disk-template=plain", *args)
    assert message in str(failure.value)


def test_hspace_refuses_an_unknown_disk_template_as_ganeti_does():
    args = ["--simulate=p,3,100g,64g,8", "--disk-template=bogus"]
    with pytest.raises(CommandError, match='Invalid string value for type DiskTemplate: "bogus"'):
        call_command("hspace", *args)
    theirs = ganeti("hspace", *args)
    assert theirs.returncode != 0 and 'Invalid string value for type DiskTemplate: "bogus"' in theirs.stderr


# ---------------------------------------------------------------- hbal


def two_groups_with_instances(tmp_path):
    sections = TWO_GROUPS.read_text().split("\n\n")
    sections[2] = "i1|1024|1024|1|running|Y|node-01-001||ext||1|-|N\ni2|1024|1024|1|running|Y|node-01-001||ext||1|-|N"
    path = tmp_path / "two-groups.txt"
    path.write_text("\n\n".join(sections))
    return path


def test_hbal_with_several_groups_asks_for_one(tmp_path, capsys):
    path = two_groups_with_instances(tmp_path)
    with pytest.raises(CommandError, match="Found multiple node groups: group-01, group-02; choose one with -G"):
        call_command("hbal", "-t", str(path))
    with pytest.raises(CommandError, match="Node group nosuch not found"):
        call_command("hbal", "-t", str(path), "-G", "nosuch")
    # Without instances hbal stops before it looks at the groups, as Ganeti's does.
    call_command("hbal", "-t", str(TWO_GROUPS))
    assert capsys.readouterr().out == ganeti("hbal", "-t", str(TWO_GROUPS)).stdout == "Cluster is empty, exiting.\n"


def test_hbal_group_option_balances_that_group_as_ganeti_does(tmp_path, capsys):
    path = two_groups_with_instances(tmp_path)
    theirs = ganeti("hbal", "-t", str(path))
    assert theirs.returncode == 1 and "Found multiple node groups" in theirs.stdout + theirs.stderr
    call_command("hbal", "-t", str(path), "-G", "group-01", "--strategy=steepest")
    ours = capsys.readouterr().out
    theirs = ganeti("hbal", "-t", str(path), "-G", "group-01")
    assert theirs.returncode == 0
    assert "Cluster score improved from 4.25781250 to 0.00781250" in theirs.stdout
    assert "Cluster score improved from 4.25781250 to 0.00781250" in ours
    assert ours == theirs.stdout  # Ganeti's text, columns padded as hbal pads them
    call_command("hbal", "-t", str(path), "--group", "fake-uuid-02")  # a UUID works too; no instances there
    out = capsys.readouterr().out
    assert (
        out.endswith("Nothing to do, exiting\n") and out == ganeti("hbal", "-t", str(path), "-G", "fake-uuid-02").stdout
    )


def test_hbal_refuses_a_negative_move_limit(tmp_path, capsys):
    path = two_groups_with_instances(tmp_path)
    with pytest.raises(CommandError, match="--max-moves must be 0 or more"):
        call_command("hbal", "-t", str(path), "-G", "group-01", "--max-moves", "-5")
    call_command("hbal", "-t", str(path), "-G", "group-01", "--max-moves", "0")
    assert "Solution length=0" in capsys.readouterr().out


# ---------------------------------------------------------------- hsqueeze


def test_hsqueeze_takes_ganetis_target_resources_spelling(capsys):
    path = str(DATA / "ganeti" / "ext-6-nodes.txt")
    call_command("hsqueeze", "-t", path, "--target-resources=3", "--json")
    ganeti_spelling = json.loads(capsys.readouterr().out)
    call_command("hsqueeze", "-t", path, "--target-util=3", "--json")
    assert json.loads(capsys.readouterr().out) == ganeti_spelling
    with pytest.raises(CommandError, match="--target-resources must be a positive number"):
        call_command("hsqueeze", "-t", path, "--target-resources=0")


# ---------------------------------------------------------------- iallocator


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("memory"), "invalid data for instance 'new1': key 'memory' not found"),
        (lambda r: r.update(memory="lots"), "invalid data for instance 'new1': key 'memory': Unable to read Int"),
        (lambda r: r.pop("name"), "invalid request dict: key 'name' not found"),
    ],
)
def test_iallocator_malformed_requests_exit_1_naming_the_field(change, message, tmp_path, capsys):
    request = json.loads((DATA / "iallocator" / "allocate-plain.json").read_text())
    change(request["request"])
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    with pytest.raises(SystemExit) as exited:
        call_command("iallocator", str(path))
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"Error: {message}")
    theirs = ganeti("hail", str(path))
    assert theirs.returncode == 1 and theirs.stderr.startswith(f"Error: {message}")


def test_iallocator_negative_memory_fails_as_hail_does(tmp_path, capsys):
    request = json.loads((DATA / "iallocator" / "allocate-plain.json").read_text())
    request["request"]["memory"] = -5
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    call_command("iallocator", str(path))
    ours = capsys.readouterr().out.strip()
    assert '"success":false' in ours and "FailMem" in ours
    assert ours == ganeti("hail", str(path)).stdout.strip()
