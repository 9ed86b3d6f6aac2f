"""The VM lifecycle on the simulator, jobs run synchronously in this process."""

import pytest

from capacity.models import Allocation
from capacity.snapshot import snapshot
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from jobs.models import Job
from provisioning import services
from provisioning.models import VM, HostImage


def create(owner, image, **kwargs):
    vm, job = services.request_vm(actor=owner, owner=owner, image=image, **kwargs)
    return vm, job


def job_of(job):
    return Job.objects.get(pk=job.pk)


def vm_of(vm):
    return VM.objects.get(pk=vm.pk)


def test_it_creates_a_vm_end_to_end(sim_host, image, alice, sync_jobs):
    vm, job = create(alice, image)
    sync_jobs.drain()
    job = job_of(job)
    assert job.status == "success", job.error_message
    assert [s["name"] for s in job.steps] == ["claim", "stage", "define", "start", "address", "ready"]
    vm = vm_of(vm)
    assert vm.state == "running" and vm.host == sim_host and vm.address
    assert vm.allocation.released is None and vm.allocation.host == sim_host
    assert SimVM.objects.get(key=vm.key).state == "running"
    assert HostImage.objects.get(host=sim_host, variant=vm.variant).state == "staged"


def test_every_action_runs_as_a_job(sim_host, image, alice, sync_jobs):
    vm, _ = create(alice, image)
    sync_jobs.drain()
    for action, state in (("suspend", "suspended"), ("resume", "running"), ("stop", "stopped"), ("start", "running")):
        job = services.submit_action(vm_of(vm), action, actor=alice)
        sync_jobs.drain()
        assert job_of(job).status == "success", job_of(job).error_message
        assert vm_of(vm).state == state
        assert SimVM.objects.get(key=vm.key).state == state
    job = services.submit_action(vm_of(vm), "snapshot", actor=alice, name="clean")
    sync_jobs.drain()
    assert job_of(job).status == "success", job_of(job).error_message
    services.submit_action(vm_of(vm), "stop", actor=alice)
    sync_jobs.drain()
    job = services.submit_action(vm_of(vm), "revert", actor=alice, name="clean")
    sync_jobs.drain()
    assert job_of(job).status == "success", job_of(job).error_message
    assert vm_of(vm).state == "running"
    job = services.submit_action(vm_of(vm), "destroy", actor=alice)
    sync_jobs.drain()
    assert job_of(job).status == "success", job_of(job).error_message
    vm = vm_of(vm)
    assert vm.state == "destroyed" and vm.address is None
    assert not SimVM.objects.filter(key=vm.key).exists()
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_repeated_create_never_makes_a_second_vm(sim_host, image, alice, sync_jobs):
    vm, _ = create(alice, image)
    sync_jobs.drain()
    first = vm_of(vm).allocation_id
    # A job submitted again for a built VM does nothing.
    job = services.jobs.submit("vm.create", {"vm": vm.pk}, actor="test")
    sync_jobs.drain()
    assert job_of(job).status == "success" and job_of(job).result["already"] is True
    # A worker lost after the hypervisor made the VM, before the step was recorded: all steps run again.
    VM.objects.filter(pk=vm.pk).update(state="defining")
    job = services.jobs.submit("vm.create", {"vm": vm.pk}, actor="test")
    sync_jobs.drain()
    assert job_of(job).status == "success", job_of(job).error_message
    assert vm_of(vm).state == "running" and vm_of(vm).allocation_id == first
    assert SimVM.objects.filter(key=vm.key).count() == 1
    assert Allocation.objects.filter(released__isnull=True).count() == 1


@pytest.mark.parametrize("step", ["stage_image", "create", "start", "address"])
def test_a_failure_at_any_step_leaves_nothing_behind(sim_host, image, alice, sync_jobs, step):
    sim.set_fault("sim-1", step, "fail")
    vm, job = create(alice, image)
    sync_jobs.drain()
    job = job_of(job)
    assert job.status == "error"
    assert f"injected failure on sim-1/{step}" in job.error_message
    vm = vm_of(vm)
    assert vm.state == "failed" and f"sim-1/{step}" in vm.error
    assert not SimVM.objects.filter(key=vm.key).exists()
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_failed_create_can_be_retried(sim_host, image, alice, sync_jobs):
    from jobs import services as jobs

    sim.set_fault("sim-1", "start", "fail")
    vm, job = create(alice, image)
    sync_jobs.drain()
    sim.clear_fault("sim-1")
    again = jobs.retry(job_of(job), actor="test")
    sync_jobs.drain()
    assert job_of(again).status == "success", job_of(again).error_message
    assert vm_of(vm).state == "running"
    assert SimVM.objects.filter(key=vm.key).count() == 1
    assert Allocation.objects.filter(released__isnull=True).count() == 1


def test_no_capacity_fails_with_the_reason(make_host, image, alice, sync_jobs):
    make_host("tiny", cpus=1, memory_mib=256, disk_gib=1)
    vm, job = create(alice, image)
    sync_jobs.drain()
    job = job_of(job)
    assert job.status == "error" and "NoCapacity" in job.error_message, job.error_message
    assert "no capacity" in vm_of(vm).error
    assert vm_of(vm).state == "failed"
    assert not Allocation.objects.exists()


def test_it_stages_an_image_once_per_host(sim_host, image, alice, sync_jobs):
    vms = [create(alice, image)[0] for _ in range(3)]
    sync_jobs.drain()
    assert {vm_of(vm).state for vm in vms} == {"running"}
    assert HostImage.objects.filter(host=sim_host).count() == 1
    steps = [Job.objects.get(opcode="vm.create", params={"vm": vm.pk}).steps[1]["result"] for vm in vms]
    assert [s["cached"] for s in steps] == [False, True, True]


def test_it_refuses_a_user_acting_on_someone_elses_vm(sim_host, image, alice, bob, sync_jobs):
    from jobs import services as jobs

    vm, _ = create(alice, image)
    sync_jobs.drain()
    job = jobs.submit("vm.destroy", {"vm": vm.pk}, actor=bob)
    sync_jobs.drain()
    assert job_of(job).status == "error" and f"VM {vm.pk} does not exist" in job_of(job).error_message
    assert vm_of(vm).state == "running"


def test_another_users_vm_and_a_missing_one_fail_alike(sim_host, image, alice, bob, sync_jobs):
    """Job errors must not tell bob which VM ids exist (id probing)."""
    from jobs import services as jobs

    vm, _ = create(alice, image)
    sync_jobs.drain()
    missing = vm.pk + 1000
    theirs = jobs.submit("vm.start", {"vm": vm.pk}, actor=bob)
    absent = jobs.submit("vm.start", {"vm": missing}, actor=bob)
    sync_jobs.drain()

    theirs, absent = job_of(theirs), job_of(absent)
    assert theirs.error_message.replace(str(vm.pk), "N") == absent.error_message.replace(str(missing), "N")
    assert (theirs.error_kind, theirs.status) == (absent.error_kind, absent.status) == (absent.error_kind, "error")


def test_migrate_moves_the_vm_and_its_claim(make_host, image, alice, sync_jobs):
    source = make_host("sim-a")
    vm, _ = create(alice, image)
    sync_jobs.drain()
    assert vm_of(vm).host == source
    target = make_host("sim-b")
    job = services.submit_action(vm_of(vm), "migrate", actor="test", target=target.pk)
    sync_jobs.drain()
    assert job_of(job).status == "success", job_of(job).error_message
    vm = vm_of(vm)
    assert vm.host == target and vm.state == "running" and vm.allocation.host == target
    assert SimVM.objects.get(key=vm.key).host.name == "sim-b"
    assert list(Allocation.objects.filter(released__isnull=True).values_list("host", flat=True)) == [target.pk]


def test_migrate_without_a_target_never_chooses_the_vms_own_host(make_host, image, alice, sync_jobs):
    from inventory.models import NodeGroup

    packed = NodeGroup.objects.create(name="packed", placement_policy="pack")  # picks the fullest host: the source
    source = make_host("sim-a", group=packed)
    vm, _ = create(alice, image)
    sync_jobs.drain()
    other = make_host("sim-b", group=packed)
    snapshot.expire()
    job = services.submit_action(vm_of(vm), "migrate", actor="test")
    sync_jobs.drain()
    assert job_of(job).status == "success", job_of(job).error_message
    assert vm_of(vm).host == other and vm_of(vm).allocation.host == other
    assert source.pk not in Allocation.objects.filter(released__isnull=True).values_list("host", flat=True)


def test_migrate_to_a_drained_host_fails_cleanly(make_host, image, alice, sync_jobs):
    source = make_host("sim-a")
    vm, _ = create(alice, image)
    sync_jobs.drain()
    target = make_host("sim-b", state="drained")
    job = services.submit_action(vm_of(vm), "migrate", actor="test", target=target.pk)
    sync_jobs.drain()
    assert job_of(job).status == "error" and "drained" in job_of(job).error_message
    vm = vm_of(vm)
    assert vm.host == source and vm.state == "running" and vm.target_allocation is None
    assert list(Allocation.objects.filter(released__isnull=True).values_list("host", flat=True)) == [source.pk]


def test_evacuate_runs_as_a_plan_of_one_migrate_per_vm(make_host, image, alice, sync_jobs):
    from jobs import services as jobs

    source = make_host("sim-a")
    vms = [create(alice, image)[0] for _ in range(3)]
    sync_jobs.drain()
    target = make_host("sim-b")
    snapshot.expire()  # placement sees a new host within a second; this test does not wait for it
    job = jobs.submit("node.evacuate", {"hypervisor": source.pk}, actor="test")
    sync_jobs.drain()
    job = job_of(job)
    assert job.status == "success", job.error_message
    assert job.result["plan"]
    children = Job.objects.filter(pk__in=job.result["jobs"])
    assert sorted(c.params["vm"] for c in children) == sorted(vm.pk for vm in vms)
    details = [(c.opcode, c.status, c.error_message) for c in children]
    assert {c.opcode for c in children} == {"vm.migrate"} and {c.status for c in children} == {"success"}, details
    assert {vm_of(vm).host_id for vm in vms} == {target.pk}
    source.refresh_from_db()
    assert source.state == "drained"


def test_refresh_reports_facts_and_unreachable_hosts(sim_host, sync_jobs):
    from jobs import services as jobs

    jobs.submit("hypervisor.refresh", {"hypervisor": sim_host.pk}, actor="test")
    sync_jobs.drain()
    sim_host.refresh_from_db()
    assert sim_host.facts["reachable"] is True and sim_host.facts["cpus"] == 16
    sim.set_fault("sim-1", "facts", "unreachable")
    job = jobs.submit("hypervisor.refresh", {"hypervisor": sim_host.pk}, actor="test")
    sync_jobs.drain()
    assert job_of(job).status == "success"
    sim_host.refresh_from_db()
    assert sim_host.facts["reachable"] is False and "unreachable" in sim_host.facts["error"]
    assert sim_host.facts["cpus"] == 16 and sim_host.state == "online"


def test_a_host_with_vms_cannot_be_deleted(sim_host, image, alice, sync_jobs):
    from inventory import services as inventory

    create(alice, image)
    sync_jobs.drain()
    assert "1 VMs on it" in inventory.in_use_reasons(sim_host)


def test_it_builds_on_an_allocation_claimed_beforehand(make_host, image, alice, sync_jobs):
    from django.utils import timezone

    from capacity import services as capacity

    make_host("sim-a")
    reserved = make_host("sim-b")
    demand = capacity.Demand(vcpus=1, memory_mib=512, disk_gib=5, start=timezone.now(), purpose="reservation 1")
    allocation = capacity.claim_on_host(reserved, demand, actor="test", owner=alice)
    vm, job = create(alice, image, allocation=allocation)
    sync_jobs.drain()
    vm = vm_of(vm)
    assert job_of(job).status == "success" and vm.host == reserved and vm.allocation == allocation
    assert Allocation.objects.count() == 1


def test_a_host_that_has_the_image_cached_is_preferred(make_host, image, alice, sync_jobs):
    make_host("sim-a")
    make_host("sim-b")
    first, _ = create(alice, image)
    sync_jobs.drain()
    cached_on = vm_of(first).host
    assert HostImage.objects.get(variant__image=image).host == cached_on
    from django.utils import timezone

    from capacity import services as capacity

    alone = capacity.plan(capacity.Demand(vcpus=1, memory_mib=512, disk_gib=5, start=timezone.now()))
    assert alone.host != cached_on.name  # balanced alone would take the emptier host
    second, job = create(alice, image)
    sync_jobs.drain()
    assert vm_of(second).host == cached_on
    assert job_of(job).steps[1]["result"] == {"cached": True}


def test_a_vm_given_a_claim_on_a_host_out_of_service_is_built_elsewhere(make_host, image, alice, sync_jobs):
    from datetime import timedelta

    from django.utils import timezone

    from capacity import services as capacity
    from inventory.models import Hypervisor

    gone = make_host("sim-a")
    end = timezone.now() + timedelta(hours=2)
    demand = services.demand_for(
        image, {"vcpus": 1, "memory_mib": 512, "disk_gib": 5}, start=timezone.now(), end=end, purpose="held ahead"
    )
    claim = capacity.claim(demand, actor="test", owner=alice)
    make_host("sim-b")
    Hypervisor.objects.filter(pk=gone.pk).update(state="drained")
    snapshot.expire()
    vm, job = create(alice, image, vcpus=1, memory_mib=512, disk_gib=5, end=end, allocation=claim)
    sync_jobs.drain()
    assert job_of(job).status == "success", job_of(job).error_message
    vm = vm_of(vm)
    assert vm.host.name == "sim-b" and vm.allocation.host.name == "sim-b" and vm.state == "running"
    assert Allocation.objects.get(pk=claim.pk).released is not None
    assert list(Allocation.objects.filter(released__isnull=True).values_list("host__name", flat=True)) == ["sim-b"]
    assert not SimVM.objects.filter(host__name="sim-a").exists()
