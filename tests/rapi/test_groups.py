"""/2/groups/NAME/modify and /assign-nodes: the jobs they submit, run here, and what they refuse."""

import pytest

from inventory.models import Hypervisor, NodeGroup
from jobs.models import Job
from tests.rapi.test_protocol import ADMIN, ALICE, call

pytestmark = pytest.mark.django_db


@pytest.fixture
def hosts(admin_user, alice, make_host):
    NodeGroup.objects.create(name="rack-a")
    return [make_host("node1"), make_host("node2")]


def test_assign_nodes_moves_hosts_into_a_group_and_back_to_default(hosts, sync_jobs):
    status, job_id, _ = call("PUT", "/2/groups/rack-a/assign-nodes", ADMIN, {"nodes": ["node1", "node2"]})
    assert status == 200
    sync_jobs.drain()
    assert Job.objects.get(pk=job_id).status == "success"
    assert set(Hypervisor.objects.values_list("group__name", flat=True)) == {"rack-a"}
    status, job_id, _ = call("PUT", "/2/groups/default/assign-nodes", ADMIN, {"nodes": ["node2"]})
    sync_jobs.drain()
    assert Hypervisor.objects.get(name="node2").group is None
    status, groups, _ = call("GET", "/2/groups?bulk=1", ADMIN)
    assert {g["name"]: g["node_list"] for g in groups} == {"rack-a": ["node1"], "default": ["node2"]}


def test_modify_sets_the_allocation_policy_and_answers_the_changes(hosts, sync_jobs):
    status, job_id, _ = call("PUT", "/2/groups/rack-a/modify", ADMIN, {"alloc_policy": "last_resort"})
    assert status == 200
    sync_jobs.drain()
    assert NodeGroup.objects.get().alloc_policy == "last_resort"
    status, job, _ = call("GET", f"/2/jobs/{job_id}", ADMIN)
    assert job["opresult"] == [[["alloc_policy", "last_resort"]]] and job["ops"][0]["OP_ID"] == "OP_GROUP_SET_PARAMS"


def test_group_writes_refuse_what_vclmgr_cannot_do(hosts):
    status, error, _ = call("PUT", "/2/groups/rack-a/modify", ADMIN, {"ipolicy": {"vcpu-ratio": 2}})
    assert status == 400 and "'ipolicy'" in error["message"]
    assert call("PUT", "/2/groups/rack-a/modify", ADMIN, {"alloc_policy": "sometimes"})[0] == 400
    assert call("PUT", "/2/groups/default/modify", ADMIN, {"alloc_policy": "preferred"})[0] == 400
    assert call("PUT", "/2/groups/nowhere/modify", ADMIN, {"alloc_policy": "preferred"})[0] == 404
    assert call("PUT", "/2/groups/rack-a/assign-nodes", ADMIN, {"nodes": ["node9"]})[0] == 404
    assert call("PUT", "/2/groups/rack-a/assign-nodes", ALICE, {"nodes": ["node1"]})[0] == 403
    assert not Job.objects.exists()
