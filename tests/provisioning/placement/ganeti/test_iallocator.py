"""Our IAllocator answers equal hail's, and hail works as our external policy."""

import json
import subprocess
from pathlib import Path

import pytest

from provisioning.placement import (
    Allocation,
    Cluster,
    Host,
    NodeGroup,
    PlacementEngine,
    Request,
    Resources,
)
from provisioning.placement.ganeti.iallocator import (
    IAllocatorError,
    dumps_response,
    handle_iallocator_request,
    loads_request,
)

from ..helpers import ganeti_tool

DATA = Path(__file__).resolve().parents[3] / "data" / "placement" / "iallocator"
REQUESTS = sorted(DATA.glob("*.json"))


@pytest.mark.parametrize("path", REQUESTS, ids=lambda p: p.stem)
def test_our_answer_is_hails_answer(path):
    hail = subprocess.run([ganeti_tool("hail"), str(path)], capture_output=True, text=True)
    assert hail.returncode == 0, hail.stderr
    ours = dumps_response(handle_iallocator_request(json.loads(path.read_text())))
    assert ours == hail.stdout.strip()


def test_malformed_requests_are_errors_not_answers():
    with pytest.raises(IAllocatorError, match="Malformed JSON"):
        loads_request("{bad")
    request = json.loads((DATA / "allocate-plain.json").read_text())
    del request["nodes"]
    with pytest.raises(IAllocatorError, match="nodes"):
        handle_iallocator_request(request)
    request = json.loads((DATA / "allocate-plain.json").read_text())
    request["request"]["type"] = "dance"
    with pytest.raises(IAllocatorError, match="Invalid request type"):
        handle_iallocator_request(request)


def hosts(hail_args=""):
    return Cluster(
        tuple(
            Host(
                f"h{i}",
                Resources(16, 65536, 500),
                reserved=Resources(1, 2048, 0),
                overcommit={"vcpus": 4},
                allocations=(Allocation(f"a{i}", Resources(2, 4096 * i + 512, 10), 0),),
            )
            for i in range(4)
        ),
        groups=(
            NodeGroup("default", policy="external", iallocator=ganeti_tool("hail") + hail_args),
        ),
    )


@pytest.mark.parametrize("args", ["", " --no-capacity-checks"])
def test_hail_works_as_the_external_policy(args):
    engine = PlacementEngine(hosts(args))
    result = engine.place(Request(Resources(2, 4096, 20), 100, 3700, "vm-1"))
    assert result.ok and result.policy == "external"
    assert result.host == "h0"  # the emptiest host: hail balances too
    assert "Request successful" in result.note


def test_the_external_choice_is_checked_against_our_capacity():
    engine = PlacementEngine(hosts(" --no-capacity-checks"))
    result = engine.place(Request(Resources(2, 500000, 20), 100, 3700, "too-big"))
    assert not result.ok
    assert "external allocator" in result.note and "FailMem" in result.note
