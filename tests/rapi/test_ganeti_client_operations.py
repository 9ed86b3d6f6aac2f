"""Ganeti's own RAPI client runs an instance's and a group's operations, queries with filters,
and job filter rules, against a live daphne and real workers on the sim driver (``cluster``)."""

import time

import pytest

from inventory import services as inventory
from inventory.models import Hypervisor
from jobs.models import Job
from provisioning.models import VM
from tests.rapi.conftest import ok

pytestmark = pytest.mark.slow

WAIT = {"period": 0.2}


def create(cluster, name, pnode):
    [job_id] = ok(
        cluster.admin(
            (
                "CreateInstance",
                ["create", name, "plain", [{"size": 2048}], [{}]],
                {"os_type": "debian-12", "pnode": pnode, "beparams": {"memory": 1024}},
            )
        )
    )
    assert ok(cluster.admin(("WaitForJobCompletion", [job_id], WAIT))) == [True]


def run(cluster, *call):
    """Submit one write, wait for its job; the job's final status."""
    [job_id] = ok(cluster.admin(call))
    [_, status] = ok(cluster.admin(("WaitForJobCompletion", [job_id], WAIT), ("GetJobStatus", [job_id])))
    return status


def test_the_ganeti_client_runs_an_instances_operations(cluster):
    create(cluster, "web1", "node1")

    stopped = run(cluster, "ShutdownInstance", ["web1"])
    assert stopped["status"] == "success" and stopped["ops"][0]["OP_ID"] == "OP_INSTANCE_SHUTDOWN"
    [row] = ok(cluster.admin(("GetInstance", ["web1"])))
    assert (row["status"], row["oper_state"]) == ("ADMIN_down", False)
    assert run(cluster, "StartupInstance", ["web1"])["status"] == "success"
    rebooted = run(cluster, "RebootInstance", ["web1"], {"reboot_type": "hard"})
    assert rebooted["status"] == "success" and rebooted["ops"][0]["OP_ID"] == "OP_INSTANCE_STARTUP"
    assert VM.objects.get(name="web1").state == "running"

    assert run(cluster, "FailoverInstance", ["web1"], {"target_node": "node2"})["status"] == "success"
    renamed = run(cluster, "RenameInstance", ["web1", "web9"])
    assert renamed["status"] == "success" and renamed["summary"] == ["INSTANCE_RENAME(web9)"]
    [row] = ok(cluster.admin(("GetInstance", ["web9"])))
    assert (row["pnode"], row["status"]) == ("node2", "running")

    query, fields = ok(
        cluster.admin(
            (
                "Query",
                ["instance", ["name", "pnode", "oper_ram"], ["&", ["=~", "name", "^web"], [">=", "oper_ram", 1024]]],
            ),
            ("QueryFields", ["instance", ["name", "colour"]]),
        )
    )
    assert query["data"] == [[[0, "web9"], [0, "node2"], [0, 1024]]]
    assert [(f["name"], f["kind"]) for f in fields["fields"]] == [("name", "text"), ("colour", "unknown")]

    modified = run(cluster, "ModifyInstance", ["web9"], {"beparams": {"vcpus": 2, "maxmem": 2048}})
    assert modified["status"] == "success" and modified["ops"][0]["OP_ID"] == "OP_INSTANCE_SET_PARAMS"
    assert modified["opresult"] == [[["be/vcpus", 2], ["be/maxmem", 2048]]]
    [row] = ok(cluster.admin(("GetInstance", ["web9"])))
    assert (row["beparams"]["vcpus"], row["beparams"]["maxmem"], row["pnode"]) == (2, 2048, "node2")
    too_big = run(cluster, "ModifyInstance", ["web9"], {"beparams": {"maxmem": 65536}})
    assert too_big["status"] == "error" and "node2 has no room for" in too_big["opresult"][0][1][0]

    bad_filter, unknown, modify, reinstall, console = cluster.admin(
        ("Query", ["instance", ["name"], ["=~", "name", "("]]),
        ("StartupInstance", ["nowhere"]),
        ("ModifyInstance", ["web9"], {"hvparams": {"kernel_path": ""}, "beparams": {"vcpus": 4}}),
        ("ReinstallInstance", ["web9"]),
        ("GetInstanceConsole", ["web9"]),
    )
    assert bad_filter["code"] == 400 and "Invalid regular expression" in bad_filter["error"]
    assert unknown["code"] == 404
    assert modify["code"] == 400 and "'hvparams' cannot be modified" in modify["error"]
    assert reinstall["code"] == 409 and "clean snapshot" in reinstall["error"]
    assert console["code"] == 503 and "simulated VM" in console["error"]
    vm = VM.objects.get(name="web9")
    assert (vm.vcpus, vm.memory_mib, vm.host.name) == (2, 2048, "node2")
    assert (vm.allocation.vcpus, vm.allocation.memory_mib, vm.allocation.host.name) == (2, 2048, "node2")


def test_the_ganeti_client_runs_group_operations_filters_and_a_multi_allocation(cluster, admin_user):
    inventory.create_node_group(actor=admin_user, name="rack-a")
    assert run(cluster, "AssignGroupNodes", ["rack-a", ["node1", "node2"]])["status"] == "success"
    modified = run(cluster, "ModifyGroup", ["rack-a"], {"alloc_policy": "last_resort"})
    assert modified["opresult"] == [[["alloc_policy", "last_resort"]]]
    [groups] = ok(cluster.admin(("GetGroups", [], {"bulk": True})))
    assert {g["name"]: (g["alloc_policy"], g["node_list"]) for g in groups} == {
        "rack-a": ("last_resort", ["node1", "node2"]),
        "default": ("preferred", ["node3"]),
    }

    reject = [["opcode", ["=", "OP_ID", "OP_TAGS_SET"]]]
    [rule] = ok(cluster.admin(("AddFilter", [0, reject, "REJECT"])))
    listed, shown = ok(cluster.admin(("GetFilters",), ("GetFilter", [rule])))
    assert listed == [rule] and (shown["action"], shown["predicates"]) == ("REJECT", reject)
    [tag_job] = ok(cluster.admin(("AddNodeTags", ["node1", ["gpu"]])))
    done, status = ok(cluster.admin(("WaitForJobCompletion", [tag_job], WAIT), ("GetJobStatus", [tag_job])))
    assert done is False and status["status"] == "canceled"
    assert list(Hypervisor.objects.get(name="node1").tags.names()) == []
    bad_rule, rate = cluster.admin(
        ("AddFilter", [0, [["jobid", ["<>", "id", 1]]], "REJECT"]), ("AddFilter", [0, [], ["RATE_LIMIT", 0]])
    )
    assert bad_rule["code"] == 400 and "Unknown operator '<>'" in bad_rule["error"]
    assert rate["code"] == 400 and "RATE_LIMIT" in rate["error"]

    # PAUSE: the job waits, queued, until the rule goes; ACCEPT in its place lets it run.
    assert ok(cluster.admin(("ReplaceFilter", [rule, 0, reject, "PAUSE"]))) == [rule]
    [paused] = ok(cluster.admin(("AddNodeTags", ["node1", ["gpu"]])))
    time.sleep(1.5)  # long enough for an idle worker to have run it, were it not held
    [status] = ok(cluster.admin(("GetJobStatus", [paused])))
    assert status["status"] == "queued"
    assert ok(cluster.admin(("ReplaceFilter", [rule, 0, reject, "ACCEPT"]))) == [rule]
    assert ok(cluster.admin(("WaitForJobCompletion", [paused], WAIT))) == [True]
    assert list(Hypervisor.objects.get(name="node1").tags.names()) == ["gpu"]
    assert ok(cluster.admin(("DeleteFilter", [rule]), ("GetFilters",))) == [None, []]

    instances = [
        {"mode": "create", "name": name, "disk_template": "plain", "disks": [{"size": 1024}], "nics": [{}],
         "os_type": "debian-12", "pnode": "node3"}
        for name in ("m1", "m2")
    ]  # fmt: skip
    allocated = run(cluster, "InstancesMultiAlloc", [instances])
    result = allocated["opresult"][0]
    assert (result["allocatable"], result["failed"]) == (["m1", "m2"], [])
    assert ok(cluster.admin(*[("WaitForJobCompletion", [jid], WAIT) for _, jid in result["jobs"]])) == [True, True]
    assert sorted(VM.objects.filter(host__name="node3").values_list("name", flat=True)) == ["m1", "m2"]
    assert Job.objects.filter(opcode="vm.create").count() == 2
