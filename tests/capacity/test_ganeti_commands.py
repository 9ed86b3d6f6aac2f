"""The Ganeti-compatible commands answer like Ganeti's own binaries on the same input."""

import json
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from capacity import services as capacity
from tests.conftest import TEST

DATA = Path(__file__).resolve().parents[1] / "data" / "placement"
HTOOLS = Path("/usr/lib/ganeti/3.0/usr/bin")
HAIL = Path("/usr/lib/ganeti/3.0/usr/lib/ganeti/iallocators/hail")


def ganeti(*args):
    assert HTOOLS.exists(), "Ganeti's htools are missing: `make test` installs ganeti-htools-3.0"
    return subprocess.run(args, capture_output=True, text=True, timeout=120).stdout


def test_hspace_on_the_seed_cluster_matches_ganeti(capsys):
    args = ["--simulate=p,3,34052480,65523,24", "--disk-template=plain", "--tiered-alloc=1048576,1024,8"]
    call_command("hspace", *args, "--machine-readable")
    ours = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines() if "=" in line)
    theirs = dict(
        line.split("=", 1)
        for line in ganeti(str(HTOOLS / "hspace"), *args, "--machine-readable").splitlines()
        if "=" in line
    )
    for key in ["HTS_TSPEC", "HTS_ALLOC_INSTANCES", "HTS_ALLOC_FAIL_REASON", "HTS_OK"]:
        assert ours[key] == theirs[key], key
    assert ours["HTS_TSPEC"] == "'1024,1048576,8,1=33 1024,1048576,7,1=3'"


@pytest.mark.parametrize("name", ["allocate-plain", "multi-allocate", "relocate-drbd", "evacuate-primary"])
def test_our_iallocator_answers_as_hail_does(name, capsys):
    request = DATA / "iallocator" / f"{name}.json"
    call_command("iallocator", str(request))
    ours = json.loads(capsys.readouterr().out)
    theirs = json.loads(ganeti(str(HAIL), str(request)))
    assert ours["success"] == theirs["success"]
    assert ours["result"] == theirs["result"]


def test_a_malformed_request_exits_1_with_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(SystemExit) as exited:
        call_command("iallocator", str(bad))
    assert exited.value.code == 1
    assert capsys.readouterr().err.startswith("Error: ")


def test_hbal_on_a_ganeti_file_reaches_ganetis_score(capsys):
    path = DATA / "ganeti" / "ext-6-nodes.txt"
    call_command("hbal", "-t", str(path), "--json")
    ours = json.loads(capsys.readouterr().out)
    last = [line for line in ganeti(str(HTOOLS / "hbal"), "-t", str(path)).splitlines() if "improved" in line][-1]
    theirs = float(last.split()[-1])
    assert ours["final_score"] <= theirs + 1e-9
    assert all(move["to"] for move in ours["moves"])


def test_hbal_steepest_prints_ganetis_own_moves(capsys):
    path = DATA / "ganeti" / "drbd-8-nodes.txt"
    call_command("hbal", "-t", str(path), "--strategy", "steepest")
    ours = [line.split()[1:] for line in capsys.readouterr().out.splitlines() if " a=" in line]
    theirs = [line.split()[1:] for line in ganeti(str(HTOOLS / "hbal"), "-t", str(path)).splitlines() if " a=" in line]
    assert len(theirs) > 5 and ours == theirs  # instance, nodes before and after, score, actions


@pytest.mark.django_db
def test_the_commands_read_the_live_inventory_and_its_reservations(make_host, capsys):
    for n in range(4):
        make_host(f"live{n}", cpus=8, memory_mib=32768, disk_gib=500)
    now = timezone.now()
    for _ in range(6):
        capacity.claim(
            capacity.Demand(
                vcpus=2, memory_mib=4096, disk_gib=20, start=now, end=now + timedelta(hours=4), policy="pack"
            ),
            actor=TEST,
        )
    call_command("hspace", "--standard-alloc=20480,4096,2", "--no-capacity-checks", "--machine-readable")
    now_count = int(dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())["HTS_ALLOC_INSTANCES"])
    later = (now + timedelta(hours=5)).strftime("%Y-%m-%d %H:%M")
    call_command("hspace", "--standard-alloc=20480,4096,2", "--no-capacity-checks", "--machine-readable", "--at", later)
    later_count = int(dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())["HTS_ALLOC_INSTANCES"])
    assert later_count > now_count  # the reservations are over by then
    call_command("hbal", "--json")
    plan = json.loads(capsys.readouterr().out)
    assert plan["final_score"] <= plan["initial_score"]
    call_command("hsqueeze", "--json")
    assert json.loads(capsys.readouterr().out)["action"] in {"offline", "online", "none"}


@pytest.mark.django_db
def test_an_empty_inventory_is_a_clear_error():
    with pytest.raises(CommandError, match="no hypervisors"):
        call_command("hbal")


@pytest.mark.django_db
def test_live_hbal_and_hsqueeze_never_break_a_future_reservation(make_host, capsys):
    from capacity.models import Allocation

    busy, booked, _ = (make_host(name, cpus=16, memory_mib=65536, disk_gib=500) for name in ("busy", "booked", "free"))
    now = timezone.now()
    for n in range(6):  # running VMs, all on one host: balancing wants to spread them
        Allocation.objects.create(
            host=busy, purpose=f"vm {n}", vcpus=2, memory_mib=8192, disk_gib=20, start=now - timedelta(hours=1)
        )
    # Two hours from now a class fills nearly all of `booked`.
    Allocation.objects.create(
        host=booked,
        purpose="reservation 9",
        vcpus=8,
        memory_mib=60000,
        disk_gib=100,
        start=now + timedelta(hours=2),
        end=now + timedelta(hours=4),
    )
    call_command("hbal", "--json")
    plan = json.loads(capsys.readouterr().out)
    assert plan["moves"], "the test needs a plan that moves something"
    targets = {node for move in plan["moves"] for node in move["to"]}
    assert "booked" not in targets and "free" in targets
    assert all(move["instance"].startswith("vm-") for move in plan["moves"])  # named after the VMs
    call_command("hsqueeze", "--json")
    squeeze = json.loads(capsys.readouterr().out)
    assert not (squeeze["action"] == "offline" and "booked" in squeeze["nodes"])
