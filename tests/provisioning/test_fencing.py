"""Two workers, one VM build: the first is frozen (SIGSTOP) inside a hypervisor call past its
lease, the janitor recovers the job and a second worker finishes it; when the first comes
back it writes nothing and makes no further call to the hypervisor.

Both workers run the real ``vm.create`` against the real simulator; the first in its own
process (``stale_runner``), whose calls to the simulator a spy records as they happen.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from django.utils import timezone

from core import fencing
from core.models import Event
from drivers.sim import services as sim
from drivers.sim.models import SimFault, SimVM
from jobs import dispatcher, runner, tasks
from jobs import services as jobs
from jobs.models import Job, JobLog
from provisioning import services
from provisioning.models import VM
from tests.processes import Child, child_env, wait_for

pytestmark = pytest.mark.slow


def _calls(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _state(job, vm):
    """Everything a late write by the first worker would change."""
    row = Job.objects.filter(pk=job.pk).values().get()
    return {
        "job": row,
        "log": list(JobLog.objects.filter(job=job).values_list("id", "message")),
        "events": Event.objects.count(),
        "vm": VM.objects.filter(pk=vm.pk).values().get(),
        "sim": list(SimVM.objects.filter(key=vm.key).values()),
    }


def test_a_worker_frozen_past_its_lease_is_fenced_off(transactional_db, tmp_path, sim_host, image, alice):
    jobs.set_queue_settings(actor="test", lease_seconds=2)
    vm, job = services.request_vm(actor=alice, owner=alice, image=image)
    sim.set_fault(sim_host.name, "start", SimFault.Mode.HANG, seconds=120)  # the first worker stops there
    calls_path = tmp_path / "first-calls.jsonl"
    first = Child(
        [sys.executable, "-m", "tests.provisioning.stale_runner", str(calls_path)], child_env(), tmp_path / "first.log"
    )
    try:
        in_start = lambda: [c[1] for c in _calls(calls_path)][-1:] == ["start"]  # noqa: E731
        wait_for(in_start, 60, "the first worker to call start", first)
        time.sleep(0.3)  # inside the hang's wait, between its polls
        os.kill(first.pid, signal.SIGSTOP)
        # Only the first worker's call hangs: the fault moves to a step vm.create never calls.
        SimFault.objects.filter(host__name=sim_host.name, step="start").update(step="capture")
        wait_for(lambda: Job.objects.get(pk=job.pk).lease_until < timezone.now(), 10, "the frozen lease to expire")
        assert tasks.recover_expired() == 1

        second = dispatcher.claim_next(runner="second:1")
        assert second.job.attempt == 2
        outcome = runner.execute(second.id, second.token, time.monotonic() + 60, second.job, second.lease_seconds)
        assert outcome == "success", Job.objects.get(pk=job.pk).error_message
        settled = _state(job, vm)
        calls_before = _calls(calls_path)

        resumed = time.monotonic()
        os.kill(first.pid, signal.SIGCONT)
        sim.clear_fault(sim_host.name)  # the first worker's hung call now returns
        first.proc.wait(timeout=30)
        report = json.loads(first.output().strip().splitlines()[-1])
    finally:
        if first.alive():
            os.kill(first.pid, signal.SIGCONT)
        first.stop(sig=signal.SIGKILL)

    assert report == {"job": job.pk, "generation": 1, "outcome": "lost"}, first.output()
    # No call reached the hypervisor after the first worker came back; its last was the hung start.
    assert _calls(calls_path) == calls_before
    assert [c for c in calls_before if c[0] > resumed] == []
    assert [c[1] for c in calls_before][-1] == "start" and "address" not in [c[1] for c in calls_before]
    # It wrote nothing: the job, its log, the events, the VM and the simulated host are as the second left them.
    assert _state(job, vm) == settled
    job_row = settled["job"]
    assert job_row["status"] == "success" and job_row["attempt"] == 2 and job_row["runner"] == "second:1"
    assert job_row["result"]["vm"] == vm.pk and job_row["result"]["address"] == settled["vm"]["address"]
    assert [s["name"] for s in job_row["steps"]] == ["claim", "stage", "define", "start", "address", "ready"]
    assert settled["vm"]["state"] == "running" and len(settled["sim"]) == 1
    assert Path(first.log_path).exists()


class _LostLease:
    """A run whose lease is gone: every fenced call refuses (what ``Lease.check`` does then)."""

    def check(self):
        raise runner.LeaseLost("lease lost")


def test_a_lost_lease_in_a_create_cleanup_is_no_cleanup_failure(db, sim_host, image, alice, sync_jobs):
    """The cleanup's driver call is fenced; its ``except Exception`` (keep the claim, mark the VM
    error) must not take the refusal for a host failure and write over the new run's VM."""
    from provisioning.opcodes.lifecycle import undo_create

    vm, _ = services.request_vm(actor=alice, owner=alice, image=image)
    sync_jobs.drain()
    before = VM.objects.filter(pk=vm.pk).values().get()
    with fencing.holding(_LostLease()), pytest.raises(runner.LeaseLost):
        undo_create(vm.pk, "boot failed", actor="job 1")
    assert VM.objects.filter(pk=vm.pk).values().get() == before
    assert SimVM.objects.filter(key=vm.key).exists()


def test_a_lost_lease_in_a_stage_leaves_the_host_image_to_the_new_run(db, sim_host, image, alice):
    from provisioning.models import HostImage
    from provisioning.opcodes.staging import stage_variant

    job = jobs.submit("noop", actor=alice)
    with fencing.holding(_LostLease()), pytest.raises(runner.LeaseLost):
        stage_variant(sim_host, image.variants.get(), job.pk)
    # The slot stays this job's: the run that owns the job now stages (or has staged) it.
    assert list(HostImage.objects.values_list("state", "staging_job")) == [(HostImage.State.STAGING, job.pk)]
