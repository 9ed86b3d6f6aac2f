"""Post-build analysis (ETICS): a failed run's VM kept stopped for a while on a disk-only claim,
optionally captured as its owner's image, then destroyed (on the simulator at zero delay)."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity.models import Allocation
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from provisioning import services as vms
from provisioning.models import VM, Image
from runs import services, tasks
from tests.runs.helpers import fresh, submit

pytestmark = pytest.mark.django_db


def live_claims():
    return list(Allocation.objects.filter(released__isnull=True))


def failed(user, sync_jobs, profile, **kwargs):
    profile(output="FAIL\n", exit_status=3)
    run = submit(user, **kwargs)
    sync_jobs.drain()
    return fresh(run)


def later(minutes):
    return timezone.now() + timedelta(minutes=minutes)


def test_a_failed_runs_vm_is_kept_stopped_on_its_disk_then_destroyed(sim_host, image, alice, profile, sync_jobs):
    run = failed(alice, sync_jobs, profile, keep_failed_minutes=30)
    assert run.state == "error" and run.exit_status == 3, run.reason
    vm = VM.objects.get(pk=run.vm_id)
    assert vm.state == "stopped" and vm.owner == alice and vms.is_kept_claim(vm.allocation)
    assert services.kept_vm(run) == vm.pk and run.kept_until > later(29)
    [claim] = live_claims()  # only its disk: no CPU or memory held while it waits
    assert (claim.vcpus, claim.memory_mib, claim.disk_gib) == (0, 0, vm.disk_gib)
    assert SimVM.objects.get().state == "stopped"
    assert "kept stopped for inspection" in run.reason[-2][1]
    assert vms.run_refusal(vm, "start")  # it may not run on a disk-only claim

    assert services.discard_expired(actor="test") == 0  # not yet
    assert services.discard_expired(actor="test", now=later(31)) == 1
    assert services.discard_expired(actor="test", now=later(31)) == 0  # its job is pending
    sync_jobs.drain()
    run = fresh(run)
    assert services.kept_vm(run) is None and run.vm.state == "destroyed"
    assert not SimVM.objects.exists() and not live_claims()
    assert run.state == "error" and "kept VM" in run.reason[-1][1]


def test_a_successful_run_or_no_option_keeps_nothing(sim_host, image, alice, profile, sync_jobs):
    plain = failed(alice, sync_jobs, profile)
    assert plain.kept_until is None and plain.vm.state == "destroyed"
    profile(output="ok\n", exit_status=0)
    ok = submit(alice, keep_failed_minutes=30)
    sync_jobs.drain()
    ok = fresh(ok)
    assert ok.state == "success" and ok.kept_until is None and ok.vm.state == "destroyed"
    assert not SimVM.objects.exists() and not live_claims()


def test_a_run_killed_by_its_time_limit_counts_as_failed(settings, sim_host, image, alice, profile, sync_jobs):
    settings.RUN_MIN_SECONDS = 1
    profile(output="working\n", seconds=3600)
    run = submit(alice, time_limit=1, keep_failed_minutes=5)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "error" and "time limit" in run.error
    assert services.kept_vm(run) == run.vm_id and run.vm.state == "stopped"


@pytest.mark.parametrize("step", ["start", "guest_exec"])
def test_a_fault_of_the_vm_or_host_never_keeps_it(sim_host, image, alice, sync_jobs, step):
    sim.set_fault("sim-1", step, "fail", actor="test")
    run = submit(alice, keep_failed_minutes=30)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "error" and run.kept_until is None
    assert not SimVM.objects.exists() and not live_claims()


def test_a_kept_vm_of_a_pooled_image_is_never_pooled(sim_host, image, alice, bob, profile, sync_jobs):
    vms.update_image(image, actor="test", pool_size=1)
    first = failed(alice, sync_jobs, profile, keep_failed_minutes=30)
    assert services.kept_vm(first) == first.vm_id
    assert not vms.parked(image).exists()
    profile(output="ok\n", exit_status=0)
    second = submit(bob)
    sync_jobs.drain()
    second = fresh(second)
    assert second.state == "success" and second.vm_id != first.vm_id
    assert fresh(first).vm.state == "stopped" and fresh(first).vm.owner == alice


def test_capture_makes_an_image_of_the_owners_then_destroys(sim_host, image, alice, profile, sync_jobs):
    run = failed(alice, sync_jobs, profile, capture_failed=True)
    assert services.kept_vm(run) == run.vm_id  # 0 minutes: due at the next round
    assert tasks.housekeeping()["discarded"] == 1
    sync_jobs.drain()
    run = fresh(run)
    captured = Image.objects.get(pk=run.captured_image_id)
    assert captured.name == f"debian-12-run-{run.pk}" and captured.parent == image
    assert captured.visibility == Image.Visibility.RESTRICTED  # not anyone else's to use
    assert run.vm.state == "destroyed" and not SimVM.objects.exists() and not live_claims()
    assert any("captured as the image" in entry[1] for entry in run.reason)


def test_the_owner_sees_and_discards_it_early_and_a_stranger_cannot(
    sim_host, image, alice, bob, profile, sync_jobs, client
):
    run = failed(alice, sync_jobs, profile, keep_failed_minutes=60)
    client.force_login(bob)
    assert client.post(f"/api/v1/runs/{run.pk}/discard/").status_code == 404
    client.force_login(alice)
    body = client.get(f"/api/v1/runs/{run.pk}/").json()
    assert body["kept_vm"] == run.vm_id and body["kept_until"] and body["keep_failed_minutes"] == 60
    assert "kept for inspection" in client.get(f"/runs/{run.pk}/").content.decode()
    assert client.post(f"/api/v1/runs/{run.pk}/discard/").status_code == 202
    sync_jobs.drain()
    assert services.kept_vm(fresh(run)) is None and not SimVM.objects.exists()
    assert client.post(f"/api/v1/runs/{run.pk}/discard/").status_code == 409


def test_it_refuses_keeping_past_the_maximum_and_creates_nothing(settings, sim_host, image, alice):
    settings.RUN_KEEP_FAILED_MAX_MINUTES = 60
    with pytest.raises(ValidationError) as caught:
        submit(alice, keep_failed_minutes=61)
    assert "0 to 60 minutes" in str(caught.value.message_dict["keep_failed_minutes"])
    settings.RUN_KEEP_FAILED_MAX_MINUTES = 0
    with pytest.raises(ValidationError):
        submit(alice, capture_failed=True)
    assert not fresh_runs()


def fresh_runs():
    from runs.models import Run

    return list(Run.objects.all())


def test_the_form_asks_for_it_and_the_page_discards_it(sim_host, image, alice, profile, sync_jobs, client):
    profile(output="FAIL\n", exit_status=1)
    client.force_login(alice)
    client.post(
        "/runs/", {"platform": "debian-12/x86_64", "command": "make test", "time_limit": 5, "keep_failed_minutes": 15}
    )
    sync_jobs.drain()
    [run] = fresh_runs()
    assert run.keep_failed_minutes == 15 and services.kept_vm(run) == run.vm_id, run.reason
    assert client.post(f"/runs/{run.pk}/discard/").status_code == 302
    sync_jobs.drain()
    assert services.kept_vm(fresh(run)) is None
