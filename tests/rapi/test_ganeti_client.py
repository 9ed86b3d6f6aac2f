"""Ganeti's own RAPI client drives vclmgr: Debian's ``python3-ganeti-rapi`` run by
Debian's python3, over HTTPS (a certificate this test makes, checked by the client), against a
live daphne and real workers on the sim driver."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from accounts import tokens
from inventory.models import Hypervisor
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import VM, Image
from tests import processes
from tests.certificates import self_signed
from tests.images import small_image

pytestmark = pytest.mark.slow

SYSTEM_PYTHON = "/usr/bin/python3"
CLIENT = Path(__file__).with_name("ganeti_client.py")


@pytest.fixture
def cluster(transactional_db, tmp_path, make_host, admin_user):
    """Three sim hosts, an image, a worker cluster and daphne serving HTTPS; ``.call(user, pw, …)``."""
    if (
        not os.path.exists(SYSTEM_PYTHON)
        or subprocess.run(  # noqa: S603 (fixed command)
            [SYSTEM_PYTHON, "-c", "import ganeti.rapi.client"], capture_output=True
        ).returncode
    ):
        pytest.fail("Ganeti's RAPI client is missing: apt-get install python3-ganeti-rapi (make install-dev)")
    for n in (1, 2, 3):
        make_host(f"node{n}", cpus=16, memory_mib=32768, disk_gib=500)
    small_image("debian-12", "sim://deb")
    cert, key = self_signed(tmp_path, "rapi")
    worker = processes.start_worker(tmp_path, workers=2)
    (tmp_path / "web").mkdir()
    try:
        web = processes.start_asgi(tmp_path / "web", tls=(cert, key))
    except BaseException:
        worker.stop()
        raise

    class Cluster:
        port = web.port
        cafile = str(cert)

        def call(self, user, password, *calls):
            order = {
                "port": self.port,
                "cafile": self.cafile,
                "user": user,
                "password": password,
                "calls": [list(c) + [{}] * (3 - len(c)) for c in calls],
            }
            done = subprocess.run(  # noqa: S603 (fixed command)
                [SYSTEM_PYTHON, str(CLIENT)],
                input=json.dumps(order),
                capture_output=True,
                text=True,
                timeout=180,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
            assert done.returncode == 0, done.stderr + web.output()[-3000:]
            return json.loads(done.stdout)

        def admin(self, *calls):
            return self.call("admin", "admin-pass-1", *calls)

    try:
        yield Cluster()
    finally:
        web.stop()
        worker.stop()


def ok(answers):
    bad = [a for a in answers if "ok" not in a]
    assert not bad, bad
    return [a["ok"] for a in answers]


def test_the_ganeti_client_reads_the_cluster(cluster):
    info, version, features, nodes, node_list, groups = ok(
        cluster.admin(
            ("GetInfo",),
            ("GetVersion",),
            ("GetFeatures",),
            ("GetNodes", [], {"bulk": True}),
            ("GetNodes",),
            ("GetGroups", [], {"bulk": True}),
        )
    )

    assert version == 2
    assert "instance-create-reqv1" in features and "node-evac-res1" in features
    assert info["default_hypervisor"] == "fake" and info["enabled_hypervisors"] == ["fake"]
    assert isinstance(info["tags"], list) and info["master"] not in node_list
    assert node_list == ["node1", "node2", "node3"]
    first = nodes[0]
    assert (first["name"], first["mtotal"], first["dtotal"], first["ctotal"]) == ("node1", 32768, 500 * 1024, 16)
    assert first["role"] == "R" and first["offline"] is False and first["drained"] is False
    assert first["pinst_cnt"] == 0 and first["pinst_list"] == []
    assert groups[0]["name"] == "default" and groups[0]["node_list"] == node_list
    assert first["group.uuid"] == groups[0]["uuid"]


def test_the_ganeti_client_creates_migrates_evacuates_and_deletes(cluster):
    create = {
        "disks": [{"size": 4096}],
        "nics": [{}],
        "beparams": {"memory": 1024, "vcpus": 2},
        "os_type": "debian-12",
        "pnode": "node1",
    }
    [job_id] = ok(
        cluster.admin(
            (
                "CreateInstance",
                ["create", "web1", "plain", [{"size": 4096}], [{}]],
                {k: v for k, v in create.items() if k not in ("disks", "nics")},
            )
        )
    )
    assert isinstance(job_id, int)

    done, status, change = ok(
        cluster.admin(
            ("WaitForJobCompletion", [job_id], {"period": 0.2}),
            ("GetJobStatus", [job_id]),
            ("WaitForJobChange", [job_id, ["status"], None, None]),
        )
    )
    assert done is True, status
    assert status["status"] == "success" and status["opstatus"] == ["success"]
    assert status["summary"] == ["INSTANCE_CREATE(web1)"] and status["ops"][0]["OP_ID"] == "OP_INSTANCE_CREATE"
    assert status["opresult"] == [["node1"]]
    assert status["received_ts"][0] <= status["end_ts"][0]
    assert change["job_info"] == ["success"] and change["log_entries"]
    vm = VM.objects.get(name="web1")
    assert (vm.state, vm.host.name, vm.vcpus, vm.memory_mib, vm.disk_gib) == ("running", "node1", 2, 1024, 4)

    [instances] = ok(cluster.admin(("GetInstances", [], {"bulk": True})))
    [web1] = instances
    assert (web1["name"], web1["pnode"], web1["status"], web1["oper_state"]) == ("web1", "node1", "running", True)
    assert web1["beparams"]["vcpus"] == 2 and web1["beparams"]["memory"] == 1024 and web1["disk.sizes"] == [4096]

    [migrate] = ok(cluster.admin(("MigrateInstance", ["web1"], {"target_node": "node2"})))
    assert ok(cluster.admin(("WaitForJobCompletion", [migrate], {"period": 0.2}))) == [True]
    vm.refresh_from_db()
    assert vm.host.name == "node2"

    [evacuate] = ok(cluster.admin(("EvacuateNode", ["node2"], {"mode": "all"})))
    [finished, evac_status] = ok(
        cluster.admin(("WaitForJobCompletion", [evacuate], {"period": 0.2}), ("GetJobStatus", [evacuate]))
    )
    assert finished is True, evac_status
    [[accepted, child]] = evac_status["opresult"][0]["jobs"]
    assert accepted is True and Job.objects.get(pk=child).opcode == "vm.migrate"
    assert ok(cluster.admin(("WaitForJobCompletion", [child], {"period": 0.2}))) == [True]
    vm.refresh_from_db()
    assert vm.host.name != "node2"
    assert Hypervisor.objects.get(name="node2").state == "drained"  # node.evacuate drains first

    [role_job, role_before] = ok(cluster.admin(("SetNodeRole", ["node3", "offline"]), ("GetNodeRole", ["node3"])))
    assert ok(cluster.admin(("WaitForJobCompletion", [role_job], {"period": 0.2}))) == [True]
    [role, node3] = ok(cluster.admin(("GetNodeRole", ["node3"]), ("GetNode", ["node3"])))
    assert role == "offline" and node3["offline"] is True and node3["role"] == "O"
    [back] = ok(cluster.admin(("SetNodeRole", ["node3", "regular"])))
    assert ok(cluster.admin(("WaitForJobCompletion", [back], {"period": 0.2}), ("GetNodeRole", ["node3"]))) == [
        True,
        "regular",
    ]

    [delete] = ok(cluster.admin(("DeleteInstance", ["web1"])))
    assert ok(cluster.admin(("WaitForJobCompletion", [delete], {"period": 0.2}), ("GetInstances",))) == [True, []]
    vm.refresh_from_db()
    assert vm.state == "destroyed"


def test_the_ganeti_client_sets_and_removes_tags(cluster):
    vm, _ = vms.request_vm(actor="test", owner=None, image=Image.objects.get(), name="db1")
    # RAPI knows an instance once it is on a node: wait for the worker to place it.
    processes.wait_for(lambda: VM.objects.filter(pk=vm.pk, host__isnull=False).exists(), 60, "db1 placed")
    calls = [
        ("AddNodeTags", ["node1", ["rack:a", "gpu"]]),
        ("AddInstanceTags", ["db1", ["backup"]]),
        ("AddClusterTags", [["htools:iextags:service"]]),
    ]
    job_ids = ok(cluster.admin(*calls))
    assert ok(cluster.admin(*[("WaitForJobCompletion", [j], {"period": 0.2}) for j in job_ids])) == [True] * 3
    assert ok(cluster.admin(("GetNodeTags", ["node1"]), ("GetInstanceTags", ["db1"]), ("GetClusterTags",))) == [
        ["gpu", "rack:a"],
        ["backup"],
        ["htools:iextags:service"],
    ]

    [removed] = ok(cluster.admin(("DeleteNodeTags", ["node1", ["gpu"]])))
    assert ok(cluster.admin(("WaitForJobCompletion", [removed], {"period": 0.2}), ("GetNodeTags", ["node1"]))) == [
        True,
        ["rack:a"],
    ]
    assert sorted(Hypervisor.objects.get(name="node1").tags.names()) == ["rack:a"]
    assert sorted(VM.objects.get(pk=vm.pk).tags.names()) == ["backup"]

    listed, bulk, (canceled, why) = ok(
        cluster.admin(("GetJobs",), ("GetJobs", [], {"bulk": True}), ("CancelJob", [removed]))
    )
    assert set(job_ids) < set(listed) and {row["id"] for row in bulk} == set(listed)
    assert canceled is False and "already ended" in why


def test_the_ganeti_client_gets_ganeti_errors_for_bad_input(cluster, alice):
    bad_field, bad_type, bad_role, unknown = cluster.admin(
        ("CreateInstance", ["create", "x1", "plain", [{"size": 1024}], [{}]], {"os_type": "debian-12", "colour": 1}),
        ("CreateInstance", ["create", "x2", "plain", [{"size": "big"}], [{}]], {"os_type": "debian-12"}),
        ("SetNodeRole", ["node1", "master-candidate"]),
        ("GetInstance", ["nowhere"]),
    )
    assert bad_field["code"] == 400 and "'colour'" in bad_field["error"] and bad_field["error"].startswith("400 ")
    assert bad_type["code"] == 400 and "disks.size" in bad_type["error"] and "'int' is expected" in bad_type["error"]
    assert bad_role["code"] == 400 and "master-candidate" in bad_role["error"]
    assert unknown["code"] == 404
    assert not VM.objects.exists() and not Job.objects.filter(opcode="vm.create").exists()

    # Non-staff: reads of their own (no instances), no nodes, no writes; no credentials: 401.
    mine, nodes, write = cluster.call(
        "alice", "alice-pass-1", ("GetInstances",), ("GetNodes",), ("SetNodeRole", ["node1", "drained"])
    )
    assert mine == {"ok": []} and nodes["code"] == 403 and write["code"] == 403
    [anonymous] = cluster.call(None, None, ("GetInfo",))
    assert anonymous["code"] == 401
    [wrong] = cluster.call("admin", "not-the-password", ("GetInfo",))
    assert wrong["code"] == 401

    # A token as the basic password: a read-only one reads, and may not write.
    _, read_only = tokens.issue(alice.__class__.objects.get(username="admin"), "ro", scopes=("read",))
    info, refused = cluster.call("admin", read_only, ("GetInfo",), ("SetNodeRole", ["node1", "drained"]))
    assert "ok" in info and refused["code"] == 403
    assert Hypervisor.objects.get(name="node1").state == "online"
