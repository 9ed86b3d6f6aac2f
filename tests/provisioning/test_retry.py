"""vm.create retries a boot or placement failure once on another host (sim fault injection)."""

import pytest
from django.utils import timezone

from capacity import services as capacity
from capacity.models import Allocation
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from jobs.models import Job, JobLog
from provisioning import services
from provisioning.models import VM


def first_choice(image):
    """The host the first claim goes to (placement is deterministic on an unchanged cluster)."""
    demand = capacity.Demand(
        vcpus=image.default_vcpus,
        memory_mib=image.default_memory_mib,
        disk_gib=image.default_disk_gib,
        start=timezone.now(),
    )
    return capacity.plan(demand).host


@pytest.fixture
def two_sim_hosts(make_host):
    return {host.name: host for host in (make_host("sim-a"), make_host("sim-b"))}


@pytest.mark.parametrize("step", ["create", "start", "address"])
def test_it_boots_on_another_host_when_the_first_fails(two_sim_hosts, image, alice, sync_jobs, step):
    bad = first_choice(image)
    good = next(name for name in two_sim_hosts if name != bad)
    sim.set_fault(bad, step, "fail")
    vm, job = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "success", job.error_message
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "running" and vm.host == two_sim_hosts[good] and vm.address
    # Nothing left on the first host; its claim released, the second one live.
    assert list(SimVM.objects.filter(key=vm.key).values_list("host__name", flat=True)) == [good]
    first, second = Allocation.objects.order_by("pk")
    assert first.host == two_sim_hosts[bad] and first.released is not None
    assert second.host == two_sim_hosts[good] and second.released is None and vm.allocation == second
    # The retry is in the reason trail, the log and the steps.
    assert any(f"failed on {bad}" in entry[1] and "another host" in entry[1] for entry in job.reason), job.reason
    assert JobLog.objects.filter(job=job, level="warning", message__contains="retrying once").exists()
    names = [s["name"] for s in job.steps]
    assert names[-7:] == [
        "retry",
        "claim-retry",
        "stage-retry",
        "define-retry",
        "start-retry",
        "address-retry",
        "ready-retry",
    ]
    assert job.steps[names.index("retry")]["result"]["exclude"] == [two_sim_hosts[bad].pk]


def test_it_retries_only_once(two_sim_hosts, image, alice, sync_jobs):
    for name in two_sim_hosts:
        sim.set_fault(name, "start", "fail")
    vm, job = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "error" and "injected failure" in job.error_message
    assert [s["name"] for s in job.steps].count("retry") == 1
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "failed" and "injected failure" in vm.error
    assert not SimVM.objects.filter(key=vm.key).exists()
    assert Allocation.objects.count() == 2 and not Allocation.objects.filter(released__isnull=True).exists()


def test_with_no_other_host_the_first_failure_stands(sim_host, image, alice, sync_jobs):
    sim.set_fault("sim-1", "start", "fail")
    vm, job = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "error" and "injected failure on sim-1/start" in job.error_message
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "failed" and "no other host to retry on" in vm.error
    assert not SimVM.objects.exists() and not Allocation.objects.filter(released__isnull=True).exists()


def test_a_staging_failure_is_not_retried(two_sim_hosts, image, alice, sync_jobs):
    sim.set_fault(first_choice(image), "stage_image", "fail")
    _vm, job = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "error" and "retry" not in [s["name"] for s in job.steps]
    assert Allocation.objects.count() == 1


def test_no_retry_when_the_first_host_cannot_be_cleaned(two_sim_hosts, image, alice, sync_jobs):
    bad = first_choice(image)
    sim.set_fault(bad, "start", "fail")
    sim.set_fault(bad, "destroy", "fail")
    vm, job = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "error" and f"injected failure on {bad}/start" in job.error_message
    assert "retry" not in [s["name"] for s in job.steps]
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "error" and "cleanup failed" in vm.error
    # The VM may still be on the first host: its claim is kept until vm.destroy cleans it.
    assert list(Allocation.objects.filter(released__isnull=True).values_list("host__name", flat=True)) == [bad]
