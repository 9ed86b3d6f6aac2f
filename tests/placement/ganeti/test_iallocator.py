"""Our IAllocator answers equal hail's, and hail works as our external policy."""

import json
import subprocess
from pathlib import Path

import pytest

from placement import (
    Allocation,
    Cluster,
    Host,
    NodeGroup,
    PlacementEngine,
    Request,
    Resources,
)
from placement.ganeti.iallocator import (
    IAllocatorError,
    dumps_response,
    handle_iallocator_request,
    loads_request,
)

from ..helpers import ganeti_tool

DATA = Path(__file__).resolve().parents[2] / "data" / "placement" / "iallocator"
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
        groups=(NodeGroup("default", policy="external", iallocator=ganeti_tool("hail") + hail_args),),
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


# ---------------------------------------------------------------- bad requests, as hail answers them


def _set(key, value):
    return lambda d: d["request"].__setitem__(key, value)


def _existing(key, value):
    return lambda d: d["instances"]["i1"].__setitem__(key, value)


def _exclusion_tags(d):
    d["cluster_tags"] = ["htools:iextags:svc"]
    d["instances"]["i1"]["tags"] = ["svc:web"]
    for item in d["request"].get("instances", [d["request"]]):
        item["tags"] = ["svc:web"]


MUTATIONS = {
    # well-formed but impossible: an answer (exit 0), the same as hail's
    "negative-memory": ("allocate-plain", _set("memory", -5)),
    "zero-memory": ("allocate-plain", _set("memory", 0)),
    "negative-vcpus": ("allocate-plain", _set("vcpus", -2)),
    "fractional-memory": ("allocate-plain", _set("memory", 2048.7)),
    "existing-negative-memory": ("allocate-plain", _existing("memory", -5)),
    "multi-negative-memory": ("multi-allocate", lambda d: d["request"]["instances"][0].__setitem__("memory", -5)),
    "unknown-group": ("allocate-plain", _set("group_name", "nogroup")),
    "exclusion-tags": ("allocate-plain", _exclusion_tags),
    "exclusion-tags-multi": ("multi-allocate", _exclusion_tags),
    # malformed: hail exits 1 with "Error: …"
    "missing-memory": ("allocate-plain", lambda d: d["request"].pop("memory")),
    "string-memory": ("allocate-plain", _set("memory", "lots")),
    "numeric-string-memory": ("allocate-plain", _set("memory", "2048")),
    "null-memory": ("allocate-plain", _set("memory", None)),
    "boolean-memory": ("allocate-plain", _set("memory", True)),
    "bogus-template": ("allocate-plain", _set("disk_template", "bogus")),
    "string-tags": ("allocate-plain", _set("tags", "abc")),
    "disk-without-size": ("allocate-plain", lambda d: d["request"]["disks"][0].pop("size")),
    "missing-required-nodes": ("allocate-plain", lambda d: d["request"].pop("required_nodes")),
    "existing-string-memory": ("allocate-plain", _existing("memory", "lots")),
    "node-string-memory": ("allocate-plain", lambda d: d["nodes"]["n1"].__setitem__("total_memory", "lots")),
    "nodes-not-an-object": ("allocate-plain", lambda d: d.__setitem__("nodes", [])),
    "request-not-an-object": ("allocate-plain", lambda d: d.__setitem__("request", 5)),
    "multi-string-memory": ("multi-allocate", lambda d: d["request"]["instances"][0].__setitem__("memory", "x")),
    "weird-evac-mode": ("evacuate-plain", _set("evac_mode", "weird")),
    "missing-evac-mode": ("evacuate-plain", lambda d: d["request"].pop("evac_mode")),
    "evacuate-unknown-instance": ("evacuate-plain", _set("instances", ["nosuch"])),
    "relocate-unknown-instance": ("relocate-drbd", _set("name", "nosuch")),
    "relocate-from-unknown-node": ("relocate-drbd", _set("relocate_from", ["nx"])),
    "change-group-unknown-instance": ("change-group", _set("instances", ["nosuch"])),
    "change-group-unknown-group": ("change-group", _set("target_groups", ["nogroup"])),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_bad_requests_get_hails_answer_or_hails_exit_status(name, tmp_path):
    base, change = MUTATIONS[name]
    request = json.loads((DATA / f"{base}.json").read_text())
    change(request)
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    hail = subprocess.run([ganeti_tool("hail"), str(path)], capture_output=True, text=True)
    if hail.returncode == 0:
        assert dumps_response(handle_iallocator_request(request)) == hail.stdout.strip()
    else:
        assert hail.returncode == 1 and hail.stderr.startswith("Error: ")
        with pytest.raises(IAllocatorError) as failure:
            handle_iallocator_request(request)
        assert str(failure.value)  # a message naming the field (the command prints "Error: …")


def test_exclusion_tags_of_the_cluster_apply_to_the_new_instance():
    request = json.loads((DATA / "allocate-plain.json").read_text())
    _exclusion_tags(request)
    info = handle_iallocator_request(request)["info"]
    assert "successes 1, failures 1 (FailTags: 1)" in info


def test_memory_below_the_policy_minimum_is_failmem():
    from placement.ganeti import types as T
    from placement.ganeti.instance import Instance, check_policy

    # FailMode.MEM is 0: a falsy verdict must still count as a failure.
    assert check_policy(Instance("x", 64, 2048, 1), T.DEFAULT_IPOLICY, False) == T.FailMode.MEM
    assert check_policy(Instance("x", 128, 2048, 1), T.DEFAULT_IPOLICY, False) is None
