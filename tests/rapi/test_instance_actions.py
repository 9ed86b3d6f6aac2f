"""An instance's actions under /2/instances/NAME/: the jobs they submit and what they refuse."""

import pytest
from django.utils import timezone

from capacity import services as capacity
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import VM
from tests.rapi.test_protocol import ADMIN, ALICE, call

pytestmark = pytest.mark.django_db


@pytest.fixture
def web1(two_nodes, alice):
    host, image = two_nodes
    vm, _ = vms.request_vm(actor="test", owner=alice, image=image, name="web1", allocation=None)
    VM.objects.filter(pk=vm.pk).update(host=host, state=VM.State.RUNNING)
    Job.objects.all().delete()
    return VM.objects.get(pk=vm.pk)


def job(job_id):
    return Job.objects.get(pk=job_id)


def test_startup_and_shutdown_submit_the_vms_power_jobs(web1):
    status, job_id, _ = call("PUT", "/2/instances/web1/shutdown", ADMIN, {"timeout": 0})
    assert status == 200 and (job(job_id).opcode, job(job_id).params) == ("vm.stop", {"vm": web1.pk, "force": True})
    VM.objects.filter(pk=web1.pk).update(state=VM.State.STOPPED)
    status, error, _ = call("PUT", "/2/instances/web1/startup", ADMIN)
    # The fixture's VM holds no claim: vclmgr refuses to power it on, as its services do.
    assert status == 409 and "holds no claim" in error["message"]
    assert call("PUT", "/2/instances/web1/shutdown", ADMIN, {"timeout": 30})[0] == 400
    assert call("PUT", "/2/instances/web1/startup?no_remember=1", ADMIN)[0] == 400


def test_a_reboot_is_a_stop_then_a_start_that_waits_for_it(web1, monkeypatch):
    monkeypatch.setattr(vms, "run_refusal", lambda vm, action, now=None: None)
    status, job_id, _ = call("POST", "/2/instances/web1/reboot?type=soft", ADMIN)
    assert status == 200
    start = job(job_id)
    [[stop_id, _]] = start.depends
    assert (start.opcode, job(stop_id).opcode, start.status) == ("vm.start", "vm.stop", "waiting")
    assert call("POST", "/2/instances/web1/reboot?type=kick", ADMIN)[0] == 400
    assert call("POST", "/2/instances/web1/reboot", ADMIN, {"shutdown_timeout": 5})[0] == 400


def test_a_failover_is_a_migration_to_the_named_node(web1):
    status, job_id, _ = call("PUT", "/2/instances/web1/failover", ADMIN, {"target_node": "node2"})
    assert status == 200 and job(job_id).opcode == "vm.migrate"
    assert job(job_id).params["target"] == VM.objects.get(pk=web1.pk).host.__class__.objects.get(name="node2").pk
    assert call("PUT", "/2/instances/web1/failover", ADMIN, {"cleanup": True})[0] == 400
    assert call("PUT", "/2/instances/nowhere/failover", ADMIN, {})[0] == 404


def test_a_rename_runs_as_a_job_and_refuses_checks_it_cannot_make(web1):
    status, job_id, _ = call("PUT", "/2/instances/web1/rename", ADMIN, {"new_name": "web2"})
    assert status == 200 and (job(job_id).opcode, job(job_id).params) == (
        "instance.rename",
        {"vm": web1.pk, "name": "web2"},
    )
    assert call("PUT", "/2/instances/web1/rename", ADMIN, {"new_name": "x", "name_check": True})[0] == 400
    assert call("PUT", "/2/instances/web1/rename", ADMIN, {})[0] == 400
    assert call("PUT", "/2/instances/web1/rename", ALICE, {"new_name": "mine"})[0] == 403


def test_rename_vm_changes_the_label_and_refuses_a_taken_name(web1, admin_user):
    from core.errors import Conflict

    assert vms.rename_vm(web1.pk, "web2", actor=admin_user) is True
    assert VM.objects.get(pk=web1.pk).name == "web2"
    other, _ = vms.request_vm(actor="test", owner=None, image=web1.image, name="db1")
    with pytest.raises(Conflict, match="already exists"):
        vms.rename_vm(other.pk, "web2", actor=admin_user)


def test_a_reinstall_needs_the_images_clean_snapshot(web1, monkeypatch):
    monkeypatch.setattr(vms, "run_refusal", lambda vm, action, now=None: None)
    status, error, _ = call("POST", "/2/instances/web1/reinstall", ADMIN, {"start": True})
    assert status == 409 and "clean snapshot" in error["message"]
    VM.objects.filter(pk=web1.pk).update(snapshots=[{"name": vms.CLEAN_SNAPSHOT, "state": "stopped"}])
    status, job_id, _ = call("POST", "/2/instances/web1/reinstall", ADMIN, {"start": False})
    assert status == 200 and (job(job_id).opcode, job(job_id).params["name"]) == ("vm.revert", vms.CLEAN_SNAPSHOT)
    assert call("POST", "/2/instances/web1/reinstall", ADMIN, {"os": "windows"})[0] == 400


@pytest.fixture
def claimed(web1):
    """web1 running on a claim of its size on node1."""
    demand = capacity.Demand(vcpus=web1.vcpus, memory_mib=web1.memory_mib, disk_gib=web1.disk_gib, start=timezone.now())
    VM.objects.filter(pk=web1.pk).update(allocation=capacity.claim_on_host(web1.host, demand, actor="test"))
    return VM.objects.get(pk=web1.pk)


def test_modify_of_the_backend_parameters_is_a_resize_job(claimed):
    status, job_id, _ = call("PUT", "/2/instances/web1/modify", ADMIN, {"beparams": {"vcpus": 2, "maxmem": 2048}})
    assert status == 200
    assert (job(job_id).opcode, job(job_id).params) == ("vm.resize", {"vm": claimed.pk, "vcpus": 2, "memory_mib": 2048})
    body = {"beparams": {"memory": 1024, "minmem": 1024}, "nics": [], "hvparams": {}, "force": False}
    status, job_id, _ = call("PUT", "/2/instances/web1/modify", ADMIN, body)
    assert status == 200 and job(job_id).params == {"vm": claimed.pk, "vcpus": claimed.vcpus, "memory_mib": 1024}


@pytest.mark.parametrize(
    "body, words",
    [
        ({"hvparams": {"kernel_path": ""}}, "Parameter 'hvparams' cannot be modified"),
        ({"nics": [["add", {}]]}, "Parameter 'nics' cannot be modified"),
        ({"disks": [["add", {"size": 1024}]], "beparams": {"vcpus": 2}}, "Parameter 'disks' cannot be modified"),
        ({"os_name": "windows"}, "Parameter 'os_name' cannot be modified"),
        ({"beparams": {"minmem": 512, "maxmem": 2048}}, "'beparams.minmem' cannot differ from maxmem"),
        ({"beparams": {"auto_balance": False}}, "'beparams.auto_balance' cannot be modified"),
        ({"beparams": {"vcpus": "2"}}, "'beparams.vcpus' parameter: Type is 'str'"),
        ({"beparams": {"vcpus": 2}, "force": True}, "force is not supported"),
        ({"beparams": {"cpu_cap": 50}}, "unknown beparams field 'cpu_cap'"),
        ({"colour": "blue"}, "unknown field(s) 'colour'"),
        ({}, "No changes submitted"),
    ],
)
def test_modify_refuses_what_it_cannot_change_by_name_and_submits_nothing(claimed, body, words):
    status, error, _ = call("PUT", "/2/instances/web1/modify", ADMIN, body)
    assert status == 400 and words in error["message"], error
    assert not Job.objects.exists()


def test_modify_answers_a_refused_resize_and_only_for_operators(claimed):
    VM.objects.filter(pk=claimed.pk).update(vcpus=4)
    status, error, _ = call("PUT", "/2/instances/web1/modify", ADMIN, {"beparams": {"vcpus": 2}})
    assert status == 409 and "stop it to make it smaller" in error["message"]
    status, error, _ = call("PUT", "/2/instances/web1/modify", ADMIN, {"beparams": {"maxmem": 256}})
    assert status == 400 and "memory_mib: debian-12 needs at least 512" in error["message"]
    assert call("PUT", "/2/instances/web1/modify", ALICE, {"beparams": {"vcpus": 4}})[0] == 403
    assert not Job.objects.exists()


def test_the_console_says_why_it_is_unavailable(web1):
    status, error, _ = call("GET", "/2/instances/web1/console", ADMIN)
    assert status == 503 and "simulated VM" in error["message"]
    assert not Job.objects.exists()


def multi_item(name, **changes):
    return {"mode": "create", "name": name, "disk_template": "plain", "disks": [{"size": 1024}], "nics": [{}],
            "os_type": "debian-12", **changes}  # fmt: skip


def test_a_multi_allocation_submits_each_create_and_one_job_that_lists_them(web1, sync_jobs):
    body = {"instances": [multi_item("a1"), multi_item("a2", pnode="node2")]}
    status, job_id, _ = call("POST", "/2/instances-multi-alloc", ADMIN, body)
    assert status == 200
    params = job(job_id).params
    assert (job(job_id).opcode, params["allocatable"], params["failed"]) == ("instance.multi_alloc", ["a1", "a2"], [])
    assert [job(pk).opcode for pk in params["jobs"]] == ["vm.create", "vm.create"]
    sync_jobs.drain()
    status, done, _ = call("GET", f"/2/jobs/{job_id}", ADMIN)
    assert done["status"] == "success" and done["opresult"][0]["jobs"] == [[True, pk] for pk in params["jobs"]]


def test_a_multi_allocation_checks_every_instance_before_submitting_any(web1):
    body = {"instances": [multi_item("b1"), multi_item("b2", colour="red")]}
    status, error, _ = call("POST", "/2/instances-multi-alloc", ADMIN, body)
    assert status == 400 and error["message"].startswith("Instance 1:") and "'colour'" in error["message"]
    assert call("POST", "/2/instances-multi-alloc", ADMIN, {"instances": [multi_item("c"), multi_item("c")]})[0] == 400
    assert not Job.objects.exists() and not VM.objects.filter(name__in=["b1", "b2", "c"]).exists()
