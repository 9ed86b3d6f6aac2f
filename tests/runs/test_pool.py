"""The public pool: a poolable image's finished run leaves its VM reverted and parked for the
next run of that image (on the simulator at zero delay)."""

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError

from capacity.models import Allocation
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from provisioning import services as vms
from provisioning.models import VM
from runs import services
from tests.runs.helpers import fresh, submit

pytestmark = pytest.mark.django_db


def trail(run):
    return [entry[1] for entry in fresh(run).reason]


def live_claims():
    return list(Allocation.objects.filter(released__isnull=True))


@pytest.fixture
def pooled(image):
    return vms.update_image(image, actor="test", pool_size=1)


def until_running(run, sync_jobs):
    for _ in range(30):  # one step per execution (no time budget): stop once the command runs
        sync_jobs.run_one(budget=0) if not sync_jobs.handoffs else sync_jobs.drain(limit=1, budget=0)
        if fresh(run).state == "running":
            return
    raise AssertionError(fresh(run).reason)


def run_to_end(user, sync_jobs, **kwargs):
    run = submit(user, **kwargs)
    sync_jobs.drain()
    return fresh(run)


def test_a_poolable_images_second_run_starts_on_the_first_runs_vm(sim_host, pooled, alice, bob, profile, sync_jobs):
    profile(output="ok\n", exit_status=0)
    first = run_to_end(alice, sync_jobs)
    assert first.state == "success", first.reason
    vm = VM.objects.get(pk=first.vm_id)
    assert vm.state == "stopped" and vm.owner is None and vms.is_parked_claim(vm.allocation)
    assert any("kept in the pool" in line for line in trail(first))
    [parked_claim] = live_claims()  # its disk alone: no CPU or memory held while it waits
    assert (parked_claim.vcpus, parked_claim.memory_mib, parked_claim.disk_gib) == (0, 0, vm.disk_gib)

    second = run_to_end(bob, sync_jobs)
    assert second.state == "success", second.reason
    assert second.vm_id == first.vm_id and VM.objects.get(pk=second.vm_id).host_id == vm.host_id
    assert any(line.startswith(f"started on a pooled VM {vm.key}") for line in trail(second))
    assert SimVM.objects.count() == 1
    assert [a.pk for a in live_claims()] == [VM.objects.get(pk=vm.pk).allocation_id]  # parked again, one claim


def test_the_run_on_a_pooled_vm_gets_its_own_seed_and_claim(sim_host, pooled, alice, bob, sync_jobs):
    first = run_to_end(alice, sync_jobs)
    SimVM.objects.update(seed={"instance_id": "vcl-1-alice", "digest": "alice's"})  # as if it held a login
    parked_claim = live_claims()[0]
    second = submit(bob)
    until_running(second, sync_jobs)
    vm = VM.objects.get(pk=fresh(second).vm_id)
    assert vm.pk == first.vm_id and vm.owner == bob
    claim = Allocation.objects.get(pk=vm.allocation_id)
    assert (claim.vcpus, claim.memory_mib) == (second.vcpus, second.memory_mib) and claim.owner == bob
    assert Allocation.objects.get(pk=parked_claim.pk).released is not None  # not counted twice
    assert SimVM.objects.get().seed == {}  # reseeded as a new run's VM is (a run has no login): nothing of alice's
    sync_jobs.drain()


def test_the_pool_size_per_host_is_respected(settings, sim_host, pooled, alice, profile, sync_jobs):
    settings.RUN_STEP_SECONDS = 0.05
    profile(output="working\n", seconds=3600)
    first = submit(alice, time_limit=600)
    until_running(first, sync_jobs)
    waiting = list(sync_jobs.handoffs)  # the first's job waits its turn while the second builds
    sync_jobs.handoffs.clear()
    second = submit(alice, time_limit=600)
    until_running(second, sync_jobs)
    sync_jobs.handoffs.extend(waiting)
    assert fresh(first).vm_id != fresh(second).vm_id  # two VMs at once
    services.cancel(fresh(first), actor=alice)
    services.cancel(fresh(second), actor=alice)
    sync_jobs.drain()
    assert [fresh(first).state, fresh(second).state] == ["canceled", "canceled"]
    states = sorted(VM.objects.values_list("state", flat=True))
    assert states == ["destroyed", "stopped"]  # the first to end filled the pool (size 1), the other destroyed
    assert SimVM.objects.count() == 1 and len(live_claims()) == 1


def test_an_image_without_a_pool_size_destroys_its_vm(sim_host, image, alice, sync_jobs):
    run = run_to_end(alice, sync_jobs)
    assert run.vm.state == "destroyed" and not SimVM.objects.exists() and not live_claims()


def test_an_access_controlled_image_is_refused_a_pool(image):
    with pytest.raises(ValidationError) as refused:
        vms.update_image(image, actor="test", visibility="restricted", pool_size=2)
    assert "never pools" in refused.value.message_dict["pool_size"][0]
    with pytest.raises(ValidationError):
        vms.create_image(actor="test", name="secret", visibility="restricted", pool_size=1)
    image.refresh_from_db()
    pooled = vms.update_image(image, actor="test", pool_size=1)
    with pytest.raises(ValidationError) as refused:  # nor made restricted while it pools
        vms.update_image(pooled, actor="test", visibility="restricted")
    assert "pool_size" in refused.value.message_dict


def test_an_access_controlled_image_never_pools_even_if_its_row_says_so(sim_host, image, alice, sync_jobs):
    group = Group.objects.create(name="secure")
    alice.groups.add(group)
    image.groups.add(group)
    type(image).objects.filter(pk=image.pk).update(visibility="restricted", pool_size=3)  # past the services
    run = run_to_end(alice, sync_jobs)
    assert run.state == "success", run.reason
    assert run.vm.state == "destroyed" and not SimVM.objects.exists() and not live_claims()


def test_the_api_and_the_admin_refuse_a_pool_on_a_restricted_image(admin_client, client, admin_user, image):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(admin_user)
    answer = api.patch(f"/api/v1/images/{image.pk}/", {"visibility": "restricted", "pool_size": 1}, format="json")
    assert answer.status_code == 400 and "never pools" in str(answer.json()), answer.json()
    page = admin_client.get(f"/admin/vms/image/{image.pk}/change/")
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("groups",)}
    data.update(
        {
            "visibility": "restricted",
            "pool_size": 1,
            "required_tags": "",
            "forbidden_tags": "",
            "variants-TOTAL_FORMS": 0,
            "variants-INITIAL_FORMS": 0,
        }
    )
    answer = admin_client.post(f"/admin/vms/image/{image.pk}/change/", data)
    assert answer.status_code == 200 and "never pools" in answer.content.decode()
    image.refresh_from_db()
    assert image.pool_size == 0


def test_a_broken_vm_is_never_pooled(sim_host, pooled, alice, sync_jobs):
    sim.set_fault("sim-1", "guest_exec", "fail", actor="test")
    run = run_to_end(alice, sync_jobs)
    assert run.state == "error"
    assert run.vm.state == "destroyed" and not SimVM.objects.exists() and not live_claims()


def test_a_failed_rollback_destroys_the_vm_instead(sim_host, pooled, alice, sync_jobs):
    sim.set_fault("sim-1", "revert", "fail", actor="test")
    run = run_to_end(alice, sync_jobs)
    assert run.state == "success", run.reason
    assert run.vm.state == "destroyed" and not SimVM.objects.exists() and not live_claims()


def test_a_run_killed_by_its_time_limit_still_pools_its_vm(settings, sim_host, pooled, alice, profile, sync_jobs):
    settings.RUN_MIN_SECONDS = 1
    profile(output="", exit_status=0, seconds=30)
    run = run_to_end(alice, sync_jobs, time_limit=1)
    assert run.state == "error" and "time limit" in run.error
    assert run.vm.state == "stopped" and vms.is_parked_claim(run.vm.allocation)


def test_a_pooled_vm_on_a_full_host_is_left_and_a_new_vm_built_elsewhere(make_host, pooled, alice, sync_jobs):
    big = make_host("sim-1", driver="sim", cpus=8, memory_mib=8192, disk_gib=200)
    make_host("sim-2", driver="sim", cpus=4, memory_mib=4096, disk_gib=200)
    first = run_to_end(alice, sync_jobs)
    assert first.vm.state == "stopped" and first.vm.host == big
    Allocation.objects.create(
        host=big, purpose="someone else", vcpus=8, memory_mib=8192, disk_gib=0, start=first.created, end=None
    )
    second = run_to_end(alice, sync_jobs)
    assert second.state == "success", second.reason
    assert second.vm_id != first.vm_id and second.vm.host.name == "sim-2"  # never onto a full host
    parked = VM.objects.get(pk=first.vm_id)
    assert parked.state == "stopped" and parked.allocation.released is None  # its parked claim stands


# --- warm: the second run starts without a boot -------------------------------------------------


def job_steps(run):
    from jobs.models import Job

    return [step["name"] for step in Job.objects.get(pk=fresh(run).job).steps]


def test_a_pooled_run_resumes_the_warm_snapshot_without_a_boot(sim_host, pooled, alice, bob, profile, sync_jobs):
    profile(output="ok\n", exit_status=0)
    first = run_to_end(alice, sync_jobs)
    vm = VM.objects.get(pk=first.vm_id)
    assert "warm" in job_steps(first) and vms.has_warm_snapshot(vm) and vms.has_clean_snapshot(vm)
    assert [s["state"] for s in SimVM.objects.get().snapshots] == ["stopped", "running"]  # clean, then warm
    assert vm.state == "stopped"  # parked off, as before: the warm snapshot is where the next run starts

    second = run_to_end(bob, sync_jobs)
    assert second.state == "success" and second.vm_id == vm.pk, second.reason
    steps = job_steps(second)
    assert "warm" in steps and "start" not in steps and "reseed" not in steps, steps
    assert any(line.endswith("(reverted to its warm snapshot: no boot)") for line in trail(second))
    assert SimVM.objects.get().seed == {}  # the warm snapshot's: no one's login


def test_a_vm_whose_warm_snapshot_failed_still_pools_and_boots_its_next_run(sim_host, pooled, alice, bob, sync_jobs):
    first = submit(alice)
    for _ in range(30):  # up to the VM's ready, one step at a time; then its warm snapshot fails
        sync_jobs.run_one(budget=0) if not sync_jobs.handoffs else sync_jobs.drain(limit=1, budget=0)
        if fresh(first).vm and fresh(first).vm.state == "running":
            break
    sim.set_fault("sim-1", "snapshot", "fail", actor="test")
    sync_jobs.drain()
    first = fresh(first)
    assert first.state == "success", first.reason
    assert not vms.has_warm_snapshot(first.vm) and first.vm.state == "stopped"  # pooled all the same

    second = run_to_end(bob, sync_jobs)
    assert second.state == "success" and second.vm_id == first.vm_id, second.reason
    assert "start" in job_steps(second)  # booted from the clean snapshot
    assert any(line.endswith("(reverted to its clean snapshot, a fresh seed)") for line in trail(second))


def test_a_vm_with_a_login_in_it_never_gets_a_warm_snapshot(sim_host, pooled, alice, sync_jobs):
    from runs import pooling

    first = submit(alice)
    for _ in range(30):
        sync_jobs.run_one(budget=0) if not sync_jobs.handoffs else sync_jobs.drain(limit=1, budget=0)
        if fresh(first).vm and fresh(first).vm.state == "running":
            break
    vm = fresh(first).vm
    VM.objects.filter(pk=vm.pk).update(
        ssh_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice"
    )
    assert pooling.warm_up(vm.pk, actor="test") is False
    assert not vms.has_warm_snapshot(VM.objects.get(pk=vm.pk))
    assert all(s["name"] != "warm" for s in SimVM.objects.get().snapshots)
    sync_jobs.drain()
