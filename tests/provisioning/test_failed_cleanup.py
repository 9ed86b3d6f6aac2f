"""A VM whose removal fails keeps its claim and is marked ``error`` for repair;
a removal that succeeds, or finds the VM not there, releases it. Faults are the simulator's."""

from django.utils import timezone

from capacity import loaders
from capacity.models import Allocation
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from jobs.models import Job
from provisioning import services
from provisioning.models import VM


def live_on(host, at=None):
    return list(loaders.live_allocations(at or timezone.now(), [host.pk]))


def test_a_destroy_the_host_does_not_answer_keeps_the_claim_until_one_succeeds(sim_host, image, alice, sync_jobs):
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image, end=timezone.now() + timezone.timedelta(hours=1))
    sync_jobs.drain()
    sim.set_fault(sim_host.name, "destroy", "unreachable")
    job = services.submit_action(VM.objects.get(pk=vm.pk), "destroy", actor=alice)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "error"
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "error" and "destroy failed" in vm.error and "unreachable" in vm.error
    assert SimVM.objects.filter(key=vm.key).exists()
    # Still claimed, and past the VM's end too: it is on the host until removed.
    assert vm.allocation.released is None and vm.allocation.end is None
    assert len(live_on(sim_host, timezone.now() + timezone.timedelta(days=30))) == 1
    assert VM.objects.filter(state="error").count() == 1  # the admin's state filter lists it for repair

    sim.clear_fault(sim_host.name)
    job = services.submit_action(vm, "destroy", actor=alice)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success"
    assert VM.objects.get(pk=vm.pk).state == "destroyed" and not SimVM.objects.filter(key=vm.key).exists()
    assert live_on(sim_host) == []


def test_staff_find_error_vms_in_the_admin(client, admin_user, sim_host, image, alice, sync_jobs):
    sim.set_fault(sim_host.name, "start", "fail")
    sim.set_fault(sim_host.name, "destroy", "fail")
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    client.force_login(admin_user)
    page = client.get("/admin/vms/vm/?state__exact=error").content.decode()
    assert VM.objects.get(pk=vm.pk).key in page and "error: may still be on its host" in page
    listed = client.get("/vms/?state=error").content.decode()  # the VM list, with a destroy button
    assert VM.objects.get(pk=vm.pk).key in listed
    assert client.get("/api/v1/vms/?state=error").json()["count"] == 1


def test_a_failed_create_whose_cleanup_fails_keeps_its_claim(sim_host, image, alice, sync_jobs):
    sim.set_fault(sim_host.name, "start", "fail")
    sim.set_fault(sim_host.name, "destroy", "fail")
    vm, job = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "error"
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "error" and "cleanup failed" in vm.error
    assert vm.allocation.released is None and len(live_on(sim_host)) == 1


def test_a_migration_that_loses_track_of_the_vm_keeps_both_claims(make_host, image, alice, sync_jobs):
    source = make_host("sim-a")
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    target = make_host("sim-b")
    sim.set_fault(target.name, "migrate", "fail")
    sim.set_fault(target.name, "state", "unreachable")  # so nobody can tell whether it arrived
    sim.set_fault(source.name, "state", "unreachable")  # nor whether it stayed
    job = services.submit_action(VM.objects.get(pk=vm.pk), "migrate", actor="test", target=target.pk)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "error"
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "error" and "cannot tell whether it reached sim-b" in vm.error
    assert len(live_on(source)) == 1 and len(live_on(target)) == 1
    assert vm.allocation.host == source and vm.target_allocation.host == target


def test_a_migration_to_a_host_gone_silent_gives_the_target_back_when_the_vm_runs_on_the_source(
    make_host, image, alice, sync_jobs
):
    source = make_host("sim-a")
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    target = make_host("sim-b")
    sim.set_fault(target.name, "migrate", "fail")
    sim.set_fault(target.name, "state", "unreachable")  # the target died; the source runs it still
    job = services.submit_action(VM.objects.get(pk=vm.pk), "migrate", actor="test", target=target.pk)
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "error"
    vm = VM.objects.get(pk=vm.pk)
    assert (vm.state, vm.host, vm.target_allocation) == ("running", source, None)
    assert "sim-b did not answer afterwards" in vm.error
    assert len(live_on(source)) == 1 and live_on(target) == []


def test_a_migration_that_surely_failed_gives_the_target_back(make_host, image, alice, sync_jobs):
    source = make_host("sim-a")
    vm, _ = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    target = make_host("sim-b")
    sim.set_fault(target.name, "migrate", "fail")  # the target answers: the VM is not there
    services.submit_action(VM.objects.get(pk=vm.pk), "migrate", actor="test", target=target.pk)
    sync_jobs.drain()
    assert VM.objects.get(pk=vm.pk).state == "running"
    assert len(live_on(source)) == 1 and live_on(target) == []
    assert Allocation.objects.filter(host=target, released__isnull=False).count() == 1
