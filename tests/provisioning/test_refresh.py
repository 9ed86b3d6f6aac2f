"""The periodic facts refresh: its Schedule, the jobs it submits, and unreachable hosts drained."""

import pytest
from django.utils import timezone
from django_q.models import Schedule

from drivers.sim import services as sim
from inventory import services as inventory
from inventory.models import Hypervisor
from jobs.models import Job
from provisioning import tasks
from provisioning.opcodes import host_ops
from tests.jobs.helpers import wait_until


def refresh(sync_jobs):
    summary = tasks.refresh_all()
    sync_jobs.drain()
    return summary


def test_the_schedule_exists_and_follows_the_setting(migrated_schedules):
    schedule = Schedule.objects.get(name=tasks.REFRESH_SCHEDULE)  # made by the data migration
    assert (schedule.func, schedule.minutes, schedule.repeats) == (tasks.REFRESH_FUNC, 10, -1)
    Schedule.objects.create(name=tasks.REFRESH_SCHEDULE, func=tasks.REFRESH_FUNC, schedule_type="I", minutes=3)
    tasks.ensure_schedule(minutes=5)
    assert list(Schedule.objects.filter(name=tasks.REFRESH_SCHEDULE).values_list("minutes", flat=True)) == [5]
    tasks.ensure_schedule(minutes=0)
    assert not Schedule.objects.filter(name=tasks.REFRESH_SCHEDULE).exists()
    tasks.ensure_schedule()
    assert Schedule.objects.get(name=tasks.REFRESH_SCHEDULE).minutes == 10


def test_it_refreshes_online_and_drained_hosts_once(make_host, sync_jobs):
    online, drained, offline = make_host("sim-1"), make_host("sim-2", state="drained"), make_host("sim-3")
    inventory.set_state(offline, "offline", "broken PSU", actor="test")
    assert refresh(sync_jobs) == {"submitted": 2, "skipped": 0}
    jobs = Job.objects.filter(opcode="hypervisor.refresh")
    assert sorted(job.params["hypervisor"] for job in jobs) == [online.pk, drained.pk]
    assert {job.status for job in jobs} == {"success"}
    assert all(tasks.REFRESH_REASON in [entry[1] for entry in job.reason] for job in jobs)
    for host in (online, drained):
        host.refresh_from_db()
        assert host.facts["reachable"] is True and host.facts["cpus"] == 16
    # A refresh still queued for a host is not submitted twice.
    tasks.refresh_all()
    assert tasks.refresh_all() == {"submitted": 0, "skipped": 2}


def test_an_unreachable_host_is_drained_until_it_answers(make_host, sync_jobs):
    host, manual = make_host("sim-1"), make_host("sim-2")
    refresh(sync_jobs)
    sim.set_fault("sim-1", "facts", "unreachable")
    sim.set_fault("sim-2", "facts", "unreachable")
    inventory.set_state(manual, "drained", "kernel upgrade", actor="test")
    refresh(sync_jobs)
    host.refresh_from_db()
    assert host.state == "drained" and host.state_reason.startswith(host_ops.AUTO_DRAIN)
    assert host.facts["reachable"] is False and "unreachable" in host.facts["error"]
    assert host.facts["cpus"] == 16  # the last known facts stay
    sim.clear_fault("sim-1")
    sim.clear_fault("sim-2")
    refresh(sync_jobs)
    host.refresh_from_db()
    manual.refresh_from_db()
    assert host.state == "online" and host.facts["reachable"] is True
    assert manual.state == "drained" and manual.state_reason == "kernel upgrade"  # an admin's drain stays


@pytest.mark.slow
def test_a_worker_runs_the_schedule(worker):
    host = Hypervisor.objects.create(
        name="sim-w", address="sim-w.example.org", driver="sim", cpus=8, memory_mib=16384, disk_gib=200
    )
    sim.set_fault("sim-w", "facts", "unreachable")
    Schedule.objects.filter(name=tasks.REFRESH_SCHEDULE).update(next_run=timezone.now())

    def refreshed():
        job = Job.objects.filter(opcode="hypervisor.refresh").first()
        return job is not None and job.is_final

    wait_until(refreshed, 60, "the scheduled refresh to end", worker)
    job = Job.objects.get(opcode="hypervisor.refresh")
    assert job.status == "success" and job.params == {"hypervisor": host.pk, "drain_unreachable": True}
    assert Hypervisor.objects.get(pk=host.pk).state == "drained"
