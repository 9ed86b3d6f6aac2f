"""A VM's vCPUs and memory changed on the simulator: its claim first, then its definition."""

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from capacity import services as capacity
from capacity.models import Allocation
from core.errors import Conflict
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from jobs.models import Job, JobLog
from provisioning import resizing, services
from provisioning.models import VM


def build(owner, image, sync_jobs, **kwargs):
    vm, job = services.request_vm(actor=owner, owner=owner, image=image, **kwargs)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
    return VM.objects.get(pk=vm.pk)


def stopped(vm, sync_jobs):
    services.submit_action(vm, "stop", actor="test")
    sync_jobs.drain()
    return VM.objects.get(pk=vm.pk)


def resized(vm, sync_jobs, actor, **size):
    job = resizing.resize(vm, actor=actor, **size)
    sync_jobs.drain()
    return Job.objects.get(pk=job.pk), VM.objects.get(pk=vm.pk)


def test_a_stopped_vm_gets_its_new_size_its_claim_replaced_in_one_go(sim_host, image, alice, admin_user, sync_jobs):
    vm = stopped(build(alice, image, sync_jobs, vcpus=2, memory_mib=1024), sync_jobs)
    old = vm.allocation

    job, vm = resized(vm, sync_jobs, admin_user, vcpus=4, memory_mib=2048)

    assert job.status == "success", job.error_message
    assert [s["name"] for s in job.steps] == ["claim", "apply", "record"]
    assert job.result["applies"] == "now"
    assert job.result["changes"] == [["be/vcpus", 4], ["be/maxmem", 2048]]
    assert (vm.vcpus, vm.memory_mib) == (4, 2048)
    assert (SimVM.objects.get(key=vm.key).vcpus, SimVM.objects.get(key=vm.key).memory_mib) == (4, 2048)
    live = Allocation.objects.filter(released__isnull=True)
    assert list(live.values_list("pk", "vcpus", "memory_mib", "disk_gib")) == [
        (vm.allocation_id, 4, 2048, old.disk_gib)
    ]
    fresh = vm.allocation
    assert (fresh.start, fresh.end, fresh.host_id) == (old.start, old.end, old.host_id)
    old.refresh_from_db()
    assert old.released is not None


def test_a_running_vm_grows_at_its_next_boot(sim_host, image, alice, admin_user, sync_jobs):
    vm = build(alice, image, sync_jobs, vcpus=2, memory_mib=1024)

    job, vm = resized(vm, sync_jobs, admin_user, memory_mib=4096)

    assert job.status == "success", job.error_message
    assert (job.result["applies"], job.result["changes"]) == ("next boot", [["be/maxmem", 4096]])
    assert (vm.state, vm.vcpus, vm.memory_mib, vm.allocation.memory_mib) == ("running", 2, 4096, 4096)


def test_a_running_vm_may_not_shrink(sim_host, image, alice, admin_user, sync_jobs):
    vm = build(alice, image, sync_jobs, vcpus=2, memory_mib=1024)

    with pytest.raises(Conflict, match="stop it to make it smaller"):
        resizing.resize(vm, actor=admin_user, vcpus=1)
    assert not Job.objects.filter(opcode="vm.resize").exists()


def test_a_stopped_vm_shrinks_even_on_a_drained_host(sim_host, image, alice, admin_user, sync_jobs):
    vm = stopped(build(alice, image, sync_jobs, vcpus=2, memory_mib=1024), sync_jobs)
    sim_host.state = "drained"
    sim_host.save()

    job, vm = resized(vm, sync_jobs, admin_user, vcpus=1, memory_mib=512)

    assert job.status == "success", job.error_message
    assert (vm.allocation.vcpus, vm.allocation.memory_mib) == (1, 512)


def test_a_growth_the_host_has_no_room_for_is_refused_with_placements_words(
    make_host, image, alice, admin_user, sync_jobs
):
    make_host("small", cpus=4, memory_mib=4096)
    vm = stopped(build(alice, image, sync_jobs, vcpus=2, memory_mib=2048), sync_jobs)
    held = vm.allocation_id

    job, vm = resized(vm, sync_jobs, admin_user, memory_mib=8192)

    assert job.status == "error"
    assert "small has no room for" in job.error_message and "lack memory" in job.error_message, job.error_message
    assert (vm.memory_mib, vm.allocation_id) == (2048, held)
    assert vm.allocation.released is None and vm.allocation.memory_mib == 2048
    assert SimVM.objects.get(key=vm.key).memory_mib == 2048


def test_room_is_counted_for_the_rest_of_the_claims_window(make_host, image, alice, admin_user, sync_jobs):
    host = make_host("small", cpus=4, memory_mib=4096)
    vm = stopped(build(alice, image, sync_jobs, vcpus=1, memory_mib=1024), sync_jobs)
    assert vm.end is not None  # an ad-hoc VM of a user ends
    later = timezone.now() + timedelta(minutes=30)
    assert later < vm.end
    demand = capacity.Demand(vcpus=1, memory_mib=2048, disk_gib=0, start=later, end=later + timedelta(hours=1))
    capacity.claim_on_host(host, demand, actor="test")

    job, vm = resized(vm, sync_jobs, admin_user, memory_mib=3072)  # fits now, not in half an hour

    assert job.status == "error" and "lack memory" in job.error_message, job.error_message
    assert vm.allocation.memory_mib == 1024
    job, vm = resized(vm, sync_jobs, admin_user, memory_mib=2048)
    assert job.status == "success", job.error_message


def test_a_driver_that_fails_puts_the_claim_back(sim_host, image, alice, admin_user, sync_jobs):
    vm = stopped(build(alice, image, sync_jobs, vcpus=2, memory_mib=1024), sync_jobs)
    sim.set_fault(sim_host.name, "resize", "fail")

    job, vm = resized(vm, sync_jobs, admin_user, vcpus=3)

    assert job.status == "error" and "injected failure" in job.error_message
    assert (vm.vcpus, vm.allocation.vcpus, vm.allocation.released) == (2, 2, None)
    assert Allocation.objects.filter(released__isnull=True).count() == 1
    assert SimVM.objects.get(key=vm.key).vcpus == 2


def test_an_owner_may_not_resize_their_vm(sim_host, image, alice, sync_jobs, api):
    vm = stopped(build(alice, image, sync_jobs), sync_jobs)

    with pytest.raises(PermissionDenied):
        resizing.resize(vm, actor=alice, vcpus=4)
    assert api(alice).post(f"/api/v1/vms/{vm.pk}/resize/", {"vcpus": 4}, format="json").status_code == 403
    assert not Job.objects.filter(opcode="vm.resize").exists()


def test_sizes_the_image_does_not_allow_are_refused_by_field(sim_host, image, alice, admin_user, sync_jobs):
    vm = stopped(build(alice, image, sync_jobs), sync_jobs)

    for size, field in (({"memory_mib": 128}, "memory_mib"), ({"vcpus": 0}, "vcpus"), ({}, "vcpus")):
        with pytest.raises(ValidationError) as caught:
            resizing.resize(vm, actor=admin_user, **size)
        assert field in caught.value.message_dict


def test_a_revert_to_a_snapshot_taken_before_keeps_the_new_size(sim_host, image, alice, admin_user, sync_jobs):
    vm = stopped(build(alice, image, sync_jobs, vcpus=2, memory_mib=1024), sync_jobs)
    services.submit_action(vm, "snapshot", actor="test", name="before")
    sync_jobs.drain()
    job, vm = resized(vm, sync_jobs, admin_user, vcpus=3)
    assert job.status == "success", job.error_message
    assert next(s for s in vm.snapshots if s["name"] == "before")["size"] == [2, 1024]
    SimVM.objects.filter(key=vm.key).update(vcpus=2)  # as a hypervisor restores the snapshot's definition

    job = services.submit_action(vm, "revert", actor="test", name="before")
    sync_jobs.drain()

    assert Job.objects.get(pk=job.pk).status == "success"
    assert SimVM.objects.get(key=vm.key).vcpus == 3


def test_a_job_submitted_by_name_is_held_to_the_same_rules(sim_host, image, alice, admin_user, sync_jobs):
    vm = build(alice, image, sync_jobs, vcpus=2, memory_mib=1024)
    for size, words in (
        ({"vcpus": 2, "memory_mib": 128}, "needs at least 256"),
        ({"vcpus": 1, "memory_mib": 1024}, "smaller"),
    ):
        job = services.jobs.submit("vm.resize", {"vm": vm.pk, **size}, actor=admin_user, submitter=admin_user)
        sync_jobs.drain()
        job = Job.objects.get(pk=job.pk)
        assert job.status == "error" and words in job.error_message, job.error_message
    vm.refresh_from_db()
    assert (vm.vcpus, vm.memory_mib, vm.allocation.vcpus, vm.allocation.memory_mib) == (2, 1024, 2, 1024)


def test_a_snapshot_records_the_size_it_was_taken_at(sim_host, image, alice, sync_jobs):
    vm = build(alice, image, sync_jobs, vcpus=2, memory_mib=1024)

    services.submit_action(vm, "snapshot", actor="test", name="now")
    sync_jobs.drain()

    vm.refresh_from_db()
    assert next(s for s in vm.snapshots if s["name"] == "now")["size"] == [2, 1024]


def test_a_revert_whose_size_follow_up_fails_still_records_the_reverted_state(
    sim_host, image, alice, admin_user, sync_jobs
):
    vm = build(alice, image, sync_jobs, vcpus=2, memory_mib=1024)
    services.submit_action(vm, "snapshot", actor="test", name="hot")
    sync_jobs.drain()
    job, vm = resized(stopped(vm, sync_jobs), sync_jobs, admin_user, memory_mib=2048)
    assert job.status == "success", job.error_message
    sim.set_fault(sim_host.name, "resize", "fail")  # as vSphere refuses a running VM without hot-add

    job = services.submit_action(vm, "revert", actor=alice, name="hot")
    sync_jobs.drain()

    job = Job.objects.get(pk=job.pk)
    vm.refresh_from_db()
    assert job.status == "success", job.error_message
    assert vm.state == SimVM.objects.get(key=vm.key).state == "running"
    assert any("could not be set back" in line.message for line in JobLog.objects.filter(job=job))


def test_a_revert_to_a_running_snapshot_larger_than_the_claim_is_refused(sim_host, image, alice, admin_user, sync_jobs):
    vm = build(alice, image, sync_jobs, vcpus=2, memory_mib=4096)
    services.submit_action(vm, "snapshot", actor="test", name="hot")
    sync_jobs.drain()
    job, vm = resized(stopped(vm, sync_jobs), sync_jobs, admin_user, memory_mib=1024)
    assert job.status == "success", job.error_message

    job = services.submit_action(vm, "revert", actor=alice, name="hot")
    sync_jobs.drain()

    job = Job.objects.get(pk=job.pk)
    vm.refresh_from_db()
    assert job.status == "error" and "4096 MiB" in job.error_message and "resize" in job.error_message
    assert vm.state == SimVM.objects.get(key=vm.key).state == "stopped"  # the hypervisor was not asked
    assert vm.allocation.memory_mib == 1024


def test_a_revert_to_a_stopped_snapshot_taken_larger_is_allowed(sim_host, image, alice, admin_user, sync_jobs):
    vm = stopped(build(alice, image, sync_jobs, vcpus=2, memory_mib=4096), sync_jobs)
    services.submit_action(vm, "snapshot", actor="test", name="cold")
    sync_jobs.drain()
    job, vm = resized(vm, sync_jobs, admin_user, memory_mib=1024)
    assert job.status == "success", job.error_message

    job = services.submit_action(vm, "revert", actor=alice, name="cold")
    sync_jobs.drain()

    assert Job.objects.get(pk=job.pk).status == "success"
    assert SimVM.objects.get(key=vm.key).memory_mib == 1024


def test_a_resize_whose_wait_failed_but_which_the_host_took_keeps_the_larger_claim(
    sim_host, image, alice, admin_user, sync_jobs, monkeypatch
):
    from drivers import registry as drivers
    from drivers.base import DriverError
    from provisioning.opcodes import resize as resize_op

    vm = stopped(build(alice, image, sync_jobs, vcpus=2, memory_mib=1024), sync_jobs)

    def late(vm_id, size):  # as a vSphere task that completes after its wait gave up
        vm = VM.objects.get(pk=vm_id)
        drivers.driver_for(vm.host).resize(vm.key, size["vcpus"], size["memory_mib"])
        raise DriverError("timed out waiting for the task")

    monkeypatch.setattr(resize_op, "apply", late)
    job, vm = resized(vm, sync_jobs, admin_user, memory_mib=4096)

    assert job.status == "error" and "timed out" in job.error_message
    assert SimVM.objects.get(key=vm.key).memory_mib == 4096
    assert vm.allocation.memory_mib == 4096 and vm.allocation.released is None
    assert Allocation.objects.filter(released__isnull=True).count() == 1


def test_an_operator_resizes_another_users_vm_through_the_api_and_the_page(
    sim_host, image, alice, bob, sync_jobs, api, client, django_user_model
):
    from accounts import access

    vm = stopped(build(alice, image, sync_jobs, vcpus=2, memory_mib=1024), sync_jobs)
    access.set_roles(bob, ["operator"], actor="test")
    carol = django_user_model.objects.create_user("carol", "carol@example.org", "carol-pass-1")

    response = api(bob).post(f"/api/v1/vms/{vm.pk}/resize/", {"vcpus": 3}, format="json")
    assert response.status_code == 202, response.content
    sync_jobs.drain()
    assert Job.objects.get(pk=response.json()["job"]).status == "success"
    client.force_login(bob)
    page = client.get(f"/vms/{vm.pk}/")
    assert page.status_code == 200 and f"/vms/{vm.pk}/resize/" in page.content.decode()
    assert client.post(f"/vms/{vm.pk}/resize/", {"vcpus": 4}).status_code == 302
    sync_jobs.drain()
    vm.refresh_from_db()
    assert (vm.vcpus, vm.allocation.vcpus) == (4, 4)

    assert api(carol).post(f"/api/v1/vms/{vm.pk}/resize/", {"vcpus": 5}, format="json").status_code in (403, 404)
    client.force_login(carol)
    assert client.get(f"/vms/{vm.pk}/").status_code == 404
    assert client.post(f"/vms/{vm.pk}/resize/", {"vcpus": 5}).status_code == 404
    assert Job.objects.filter(opcode="vm.resize").count() == 2
