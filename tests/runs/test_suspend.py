"""Suspend instead of preempt, on the simulator at zero delay: a reservation that
fits only if runs of a lower class are suspended suspends the fewest of them (their VMs to
disk, their CPU and memory given back, their disk kept), is built once they are, and the runs
resume when room returns and finish with their output; plus the faults (suspend or resume
fails, the host goes offline, a cancel while suspended), the time limit that does not count
the suspended time, a reservation in use that is never suspended, and the plan's explanation.

Jobs run here one step at a time (a budget of 0), so a run's wait, a reservation's build and
a suspension interleave as they would on workers; the simulated commands last an hour unless
``finish_commands`` moves their clocks on."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from capacity.models import Allocation
from capacity.snapshot import snapshot
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from jobs import runner
from jobs.models import Job
from provisioning import services as vms
from provisioning.models import VM
from provisioning.opcodes import lifecycle
from reservations import services as reservations
from reservations.models import Reservation
from runs import services, tasks
from runs.models import Run
from tests.images import sim_image
from tests.runs.helpers import fresh, submit

pytestmark = pytest.mark.django_db
HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def _short_steps(settings, _run_settings, monkeypatch):
    settings.RUN_STEP_SECONDS = 0.02  # a wait step hands off quickly: the tests step jobs one by one
    settings.RUN_MIN_SECONDS = 1
    # A claim's wait for the suspensions it made room with, likewise: here they run only once it
    # hands off (one job at a time), so each of its waits would otherwise sleep its full 10 s.
    monkeypatch.setattr(lifecycle, "ROOM_STEP_SECONDS", 0.05)


@pytest.fixture
def small_host(make_host):
    """Room for three runs of 1024 MiB (the runs' image's default), nothing more."""
    return make_host("sim-1", driver="sim", cpus=8, memory_mib=3072, disk_gib=200)


@pytest.fixture
def desk(db):
    """An interactive image of 2048 MiB: it fits the full host only once two runs are suspended."""
    return sim_image(
        "desk", os="Desk", min_memory_mib=256, default_vcpus=1, default_memory_mib=2048, default_disk_gib=10
    )


def step(sync_jobs):
    """One step of one job: a queued one first, else the oldest hand-off (so every job goes on
    in turn, as on several workers); False when nothing can run."""
    if sync_jobs.run_one(budget=0) is not None:
        return True
    if sync_jobs.handoffs:
        job_id, token = sync_jobs.handoffs.pop(0)
        runner.execute(job_id, token, time.monotonic())
        return True
    return False


def step_until(sync_jobs, done, limit=400):
    for _ in range(limit):
        if done():
            return
        if not step(sync_jobs):
            break
    assert done()


def states(runs):
    return [fresh(run).state for run in runs]


def trail(run):
    return [entry[1] for entry in fresh(run).reason]


def output(run):
    return b"".join(bytes(c.data) for c in run.output.order_by("seq"))


def finish_commands():
    """The simulated commands' clocks an hour on: each has printed everything and exited."""
    for vm in SimVM.objects.all():
        guest = dict(vm.guest)
        guest["execs"] = {tag: {**run, "started": run["started"] - 3600} for tag, run in guest.get("execs", {}).items()}
        SimVM.objects.filter(pk=vm.pk).update(guest=guest)


def started_at(run):
    """When the simulated guest's command started, by its own clock."""
    [(_, command)] = SimVM.objects.get(key=run.vm.key).guest["execs"].items()
    return command["started"]


def running_runs(sync_jobs, owner, n=3, **kwargs):
    runs = [submit(owner, priority="low", time_limit=600, **kwargs) for _ in range(n)]
    step_until(sync_jobs, lambda: states(runs) == ["running"] * n)
    return runs


def reserve(user, image):
    return reservations.reserve(user, image, actor=user, duration=HOUR)


def status(reservation):
    return Reservation.objects.get(pk=reservation.pk).status


def made_room(sync_jobs, owner, user, desk):
    """Three low runs fill the host; ``user`` reserves a desk that fits once two are suspended,
    and it is ready. ``(runs, reservation)``."""
    runs = running_runs(sync_jobs, owner)
    reservation = reserve(user, desk)
    step_until(sync_jobs, lambda: status(reservation) == "ready")
    return runs, reservation


def end(sync_jobs, reservation, user):
    reservations.end(Reservation.objects.get(pk=reservation.pk), actor=user)
    step_until(sync_jobs, lambda: status(reservation) == "ended")


def test_a_reservation_that_fits_only_if_two_runs_are_suspended_suspends_them_and_they_resume_after_it(
    small_host, image, desk, alice, bob, profile, sync_jobs
):
    profile(output="42\n", seconds=3600)
    runs = running_runs(sync_jobs, alice)
    reservation = reserve(bob, desk)
    history = [h.reason for h in reservation.history.all()]
    assert any("suspending 2 low runs" in h for h in history), history
    asked = [run for run in runs if fresh(run).suspend_requested]
    assert len(asked) == 2 and all("to be suspended (low class)" in " ".join(trail(r)) for r in asked)

    step_until(sync_jobs, lambda: status(reservation) == "ready")
    assert sorted(states(runs)) == ["running", "suspended", "suspended"]
    suspended = [run for run in runs if fresh(run).state == "suspended"]
    assert {fresh(r).vm.state for r in suspended} == {"suspended"}
    assert set(SimVM.objects.filter(key__in=[fresh(r).vm.key for r in suspended]).values_list("state", flat=True)) == {
        "suspended"
    }
    for run in suspended:  # their disk still claimed, nothing else
        claim = fresh(run).vm.allocation
        assert vms.is_suspended_claim(claim) and claim.released is None
        assert (claim.vcpus, claim.memory_mib, claim.disk_gib) == (0, 0, 10)
    assert Job.objects.get(pk=fresh(suspended[0]).job).status == "success"  # its job ended: no worker held

    end(sync_jobs, reservation, bob)
    assert tasks.housekeeping()["resumed"] == 2
    step_until(sync_jobs, lambda: states(runs) == ["running"] * 3)
    finish_commands()
    step_until(sync_jobs, lambda: all(fresh(run).is_final for run in runs))
    for run in runs:
        run = fresh(run)
        assert run.state == "success" and run.exit_status == 0 and output(run) == b"42\n", run.reason
    for run in suspended:
        words = " ".join(trail(run))
        assert "to be suspended" in words and "suspended: its VM" in words and "resumed on sim-1 after" in words
        assert fresh(run).suspended_seconds > 0
    assert not SimVM.objects.exists()
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_suspended_runs_command_does_not_go_on_and_its_time_limit_does_not_count_the_time(
    small_host, image, desk, alice, bob, profile, sync_jobs
):
    profile(output="done\n", seconds=3600)
    runs, reservation = made_room(sync_jobs, alice, bob, desk)
    [victim, *_] = [run for run in runs if fresh(run).state == "suspended"]
    # An hour spent suspended, with a time limit of 10 minutes: it started an hour ago.
    back = fresh(victim)
    Run.objects.filter(pk=victim.pk).update(started=back.started - HOUR, suspended_at=back.suspended_at - HOUR)
    clock = started_at(back)
    end(sync_jobs, reservation, bob)
    services.resume_suspended(actor="test")
    step_until(sync_jobs, lambda: fresh(victim).state == "running")
    assert fresh(victim).suspended_seconds >= 3600
    assert started_at(back) > clock  # the guest's command was paused: its clock moved on by the time suspended
    for _ in range(20):  # its wait goes on: not killed for time
        step(sync_jobs)
    assert fresh(victim).state == "running", trail(victim)
    finish_commands()
    step_until(sync_jobs, lambda: all(fresh(run).is_final for run in runs))
    assert fresh(victim).state == "success", trail(victim)


def test_a_failed_resume_ends_the_run_with_the_reason_and_destroys_its_vm(
    small_host, image, desk, alice, bob, profile, sync_jobs
):
    profile(output="x\n", seconds=3600)
    runs, reservation = made_room(sync_jobs, alice, bob, desk)
    end(sync_jobs, reservation, bob)
    sim.set_fault("sim-1", "resume", "fail", actor="test")
    services.resume_suspended(actor="test")
    suspended = [run for run in runs if fresh(run).state == "suspended"]
    step_until(sync_jobs, lambda: all(fresh(run).is_final for run in suspended))
    for run in suspended:
        run = fresh(run)
        assert run.state == "error" and "could not be resumed on sim-1" in run.error, run.reason
        assert run.vm.state == "destroyed"
        assert not Allocation.objects.filter(pk=run.vm.allocation_id, released__isnull=True).exists()


def test_a_failed_suspension_ends_that_run_and_the_reservation_is_still_built(
    small_host, image, desk, alice, bob, profile, sync_jobs
):
    profile(output="x\n", seconds=3600)
    runs = running_runs(sync_jobs, alice)
    sim.set_fault("sim-1", "suspend", "fail", actor="test")
    reservation = reserve(bob, desk)
    step_until(sync_jobs, lambda: status(reservation) == "ready")
    ended = [fresh(run) for run in runs if fresh(run).is_final]
    assert len(ended) == 2
    for run in ended:  # never kept or pooled: destroyed, its disk claim released
        assert run.state == "error" and "could not be suspended" in run.error and run.vm.state == "destroyed"
    live = Allocation.objects.filter(released__isnull=True)
    assert live.count() == 2  # the reservation's and the run left running


def test_a_run_canceled_while_suspended_is_canceled_and_its_vm_destroyed(
    small_host, image, desk, alice, bob, profile, sync_jobs
):
    profile(output="x\n", seconds=3600)
    runs, reservation = made_room(sync_jobs, alice, bob, desk)
    victim = next(run for run in runs if fresh(run).state == "suspended")
    services.cancel(fresh(victim), actor=alice)
    step_until(sync_jobs, lambda: fresh(victim).is_final)
    run = fresh(victim)
    assert run.state == "canceled" and "canceled while suspended" in trail(run)[-1], run.reason
    assert run.vm.state == "destroyed" and not SimVM.objects.filter(key=run.vm.key).exists()
    assert not Allocation.objects.filter(pk=run.vm.allocation_id, released__isnull=True).exists()
    services.resume_suspended(actor="test")  # nothing to resume for it
    assert fresh(victim).state == "canceled"


def test_a_run_canceled_while_its_resume_is_queued_is_canceled(
    small_host, image, desk, alice, bob, profile, sync_jobs, django_capture_on_commit_callbacks
):
    profile(output="x\n", seconds=3600)
    runs, reservation = made_room(sync_jobs, alice, bob, desk)
    end(sync_jobs, reservation, bob)
    assert services.resume_suspended(actor="test") == 2
    victim = next(run for run in runs if fresh(run).state == "suspended")
    with django_capture_on_commit_callbacks(execute=True):  # its canceled job's run.cleanup, once that commits
        services.cancel(fresh(victim), actor=alice)
    step_until(sync_jobs, lambda: fresh(victim).is_final)
    assert fresh(victim).state == "canceled"
    assert not SimVM.objects.filter(key=fresh(victim).vm.key).exists()


def test_a_suspended_run_whose_host_went_offline_ends_with_the_reason(
    small_host, image, desk, alice, bob, profile, sync_jobs
):
    from inventory import services as inventory

    profile(output="x\n", seconds=3600)
    runs, reservation = made_room(sync_jobs, alice, bob, desk)
    suspended = [run for run in runs if fresh(run).state == "suspended"]
    inventory.set_state(small_host, "offline", "the host died", actor="test")
    services.resume_suspended(actor="test")
    step_until(sync_jobs, lambda: all(fresh(run).is_final for run in suspended))
    for run in suspended:
        run = fresh(run)
        assert run.state == "error" and "its host sim-1 went offline while it was suspended" in run.error, run.reason
        assert run.vm.state in ("destroyed", "error")


def test_a_drained_host_does_not_resume_its_suspended_runs(small_host, image, desk, alice, bob, profile, sync_jobs):
    from inventory import services as inventory

    profile(output="x\n", seconds=3600)
    runs, reservation = made_room(sync_jobs, alice, bob, desk)
    inventory.set_state(small_host, "drained", "maintenance", actor="test")
    end(sync_jobs, reservation, bob)
    assert services.resume_suspended(actor="test") == 0
    assert sorted(states(runs)) == ["running", "suspended", "suspended"]


def test_a_reservation_a_person_is_using_is_never_suspended(
    small_host, image, desk, alice, bob, profile, sync_jobs, django_user_model
):
    carol = django_user_model.objects.create_user("carol", password="x")  # noqa: S106
    profile(output="x\n", seconds=3600)
    in_use = reserve(bob, desk)  # 2048 of 3072 MiB
    step_until(sync_jobs, lambda: Reservation.objects.get(pk=in_use.pk).status == "ready")
    [run] = running_runs(sync_jobs, alice, n=1)  # the last 1024 MiB
    with pytest.raises(Exception, match="no host has room") as refused:
        reserve(carol, desk)  # fits only if the reservation were suspended too: never
    assert "fits if" not in str(refused.value)
    assert Reservation.objects.get(pk=in_use.pk).status == "ready" and fresh(run).state == "running"
    assert not fresh(run).suspend_requested
    assert VM.objects.get(pk=Reservation.objects.get(pk=in_use.pk).vm_id).state == "running"


def test_runs_of_the_reservations_class_or_above_are_not_suspended(
    settings, small_host, image, desk, alice, bob, profile, sync_jobs
):
    settings.RESERVATION_PRIORITY = "batch"  # reservations rank with batch runs: only low runs give way
    profile(output="x\n", seconds=3600)
    runs = [submit(alice, priority="batch", time_limit=600) for _ in range(3)]
    step_until(sync_jobs, lambda: states(runs) == ["running"] * 3)
    with pytest.raises(Exception, match="no host has room"):
        reserve(bob, desk)
    assert states(runs) == ["running"] * 3


def test_a_future_reservation_suspends_nothing(small_host, image, desk, alice, bob, profile, sync_jobs):
    profile(output="x\n", seconds=3600)
    runs = running_runs(sync_jobs, alice)
    start = timezone.now() + 2 * HOUR  # the runs hold their room until their latest end (~25 min)
    reservations.reserve(bob, desk, actor=bob, start=start, duration=HOUR)
    assert not any(fresh(run).suspend_requested for run in runs)


def test_the_plan_says_how_many_runs_suspending_would_take(
    small_host, image, alice, admin_user, api, profile, sync_jobs
):
    profile(output="x\n", seconds=3600)
    running_runs(sync_jobs, alice)
    ask = {"vcpus": 1, "memory_mib": 2048, "disk_gib": 10}
    body = api(admin_user).post("/api/v1/placement/plan/", ask, format="json").json()
    assert body["fits"] is False and body["suspend"] == "fits if 2 low runs are suspended"
    assert body["summary"].endswith("; fits if 2 low runs are suspended")
    low = api(admin_user).post("/api/v1/placement/plan/", {**ask, "priority": "low"}, format="json").json()
    assert low["suspend"] == "" and "fits if" not in low["summary"]
    assert not any(run.suspend_requested for run in Run.objects.all())  # a plan suspends nothing


def test_the_reservation_form_says_it_fits_if_runs_are_suspended(small_host, image, desk, alice, profile, sync_jobs):
    profile(output="x\n", seconds=3600)
    running_runs(sync_jobs, alice)
    now = timezone.now()
    answer = reservations.check_fit(desk, now, now + HOUR)
    assert answer.fits and answer.message == "fits if 2 low runs are suspended"


def test_a_released_claim_resumes_suspended_runs_once_it_commits(
    small_host, image, desk, alice, bob, profile, sync_jobs, django_capture_on_commit_callbacks
):
    profile(output="x\n", seconds=3600)
    runs, reservation = made_room(sync_jobs, alice, bob, desk)
    reservations.end(Reservation.objects.get(pk=reservation.pk), actor=bob)
    with django_capture_on_commit_callbacks(execute=True):
        step_until(sync_jobs, lambda: status(reservation) == "ended")
    resumes = Job.objects.filter(opcode="run.resume")
    assert resumes.count() == 2
    step_until(sync_jobs, lambda: states(runs) == ["running"] * 3)


def test_suspended_runs_move_to_another_host_with_room_and_resume_there(
    small_host, make_host, image, desk, alice, bob, profile, sync_jobs
):
    profile(output="42\n", seconds=3600)
    runs = running_runs(sync_jobs, alice)
    reservation = reserve(bob, desk)  # in use: it stays on sim-1
    step_until(sync_jobs, lambda: status(reservation) == "ready")
    suspended = [run for run in runs if fresh(run).state == "suspended"]
    assert services.resume_suspended(actor="test") == 0  # no room anywhere yet
    make_host("sim-2", driver="sim", cpus=8, memory_mib=2048, disk_gib=200)
    snapshot.expire()  # a worker's snapshot notices a new host within seconds; this test does not wait
    assert services.resume_suspended(actor="test") == 2
    step_until(sync_jobs, lambda: states(suspended) == ["running"] * 2)
    for run in suspended:
        run = fresh(run)
        assert run.vm.host.name == "sim-2" and SimVM.objects.get(key=run.vm.key).host.name == "sim-2"
        assert "room on sim-2: moving it there to resume" in " ".join(trail(run))
        assert "resumed on sim-2" in trail(run)[-1]
        live = Allocation.objects.filter(pk=run.vm.allocation_id, released__isnull=True).get()
        assert live.host.name == "sim-2" and live.memory_mib == 1024  # its whole size there, its old disk claim gone
    assert Allocation.objects.filter(released__isnull=True, host__name="sim-1").count() == 2  # the reservation, a run
    finish_commands()
    step_until(sync_jobs, lambda: all(fresh(run).is_final for run in runs))
    assert [output(fresh(run)) for run in runs] == [b"42\n"] * 3 and states(runs) == ["success"] * 3


def test_a_failed_move_leaves_the_run_suspended_where_it_was_and_it_resumes_there_when_room_returns(
    small_host, make_host, image, desk, alice, bob, profile, sync_jobs
):
    profile(output="42\n", seconds=3600)
    runs = running_runs(sync_jobs, alice)
    reservation = reserve(bob, desk)
    step_until(sync_jobs, lambda: status(reservation) == "ready")
    suspended = [run for run in runs if fresh(run).state == "suspended"]
    other = make_host("sim-2", driver="sim", cpus=8, memory_mib=2048, disk_gib=200)
    snapshot.expire()
    sim.set_fault("sim-2", "migrate", "fail", actor="test")
    assert services.resume_suspended(actor="test") == 2
    moves = [fresh(run).job for run in suspended]
    step_until(sync_jobs, lambda: all(Job.objects.get(pk=job).is_final for job in moves))
    for run in suspended:
        run = fresh(run)
        assert run.state == "suspended", trail(run)
        assert trail(run)[-1].startswith("its VM could not be moved to sim-2 (") and trail(run)[-1].endswith(
            "still suspended on sim-1, it resumes when room returns"
        ), trail(run)
        assert run.vm.host.name == "sim-1" and SimVM.objects.get(key=run.vm.key).state == "suspended"
        assert vms.is_suspended_claim(run.vm.allocation) and run.vm.target_allocation_id is None
        assert Job.objects.get(pk=run.job).result["refused_by"] == other.pk
    assert not Allocation.objects.filter(released__isnull=True, host__name="sim-2").exists()
    assert services.resume_suspended(actor="test") == 0  # not sim-2 again: it refused them
    end(sync_jobs, reservation, bob)
    assert services.resume_suspended(actor="test") == 2  # room on sim-1 again
    step_until(sync_jobs, lambda: states(suspended) == ["running"] * 2)
    finish_commands()
    step_until(sync_jobs, lambda: all(fresh(run).is_final for run in runs))
    assert [output(fresh(run)) for run in runs] == [b"42\n"] * 3 and states(runs) == ["success"] * 3
    assert all(fresh(run).vm.error == "" for run in suspended)


def test_a_high_class_run_that_fits_only_if_a_low_run_is_suspended_suspends_it_and_it_resumes_after(
    small_host, image, alice, bob, profile, sync_jobs
):
    profile(output="7\n", seconds=3600)
    runs = running_runs(sync_jobs, alice)
    urgent = submit(bob, priority="high", time_limit=600)
    step_until(sync_jobs, lambda: fresh(urgent).state == "running")
    assert sorted(states(runs)) == ["running", "running", "suspended"]
    [victim] = [run for run in runs if fresh(run).state == "suspended"]
    assert f"to be suspended (low class): vm {fresh(urgent).vm_id} of a higher class" in " ".join(trail(victim))
    assert SimVM.objects.get(key=fresh(victim).vm.key).state == "suspended"

    finish_commands()
    step_until(sync_jobs, lambda: fresh(urgent).is_final)
    assert fresh(urgent).state == "success" and output(fresh(urgent)) == b"7\n"
    tasks.housekeeping()
    step_until(sync_jobs, lambda: fresh(victim).state == "running")
    finish_commands()
    step_until(sync_jobs, lambda: all(fresh(run).is_final for run in runs))
    for run in runs:
        assert fresh(run).state == "success" and output(fresh(run)) == b"7\n", trail(run)
    assert "resumed on sim-1 after" in " ".join(trail(victim))
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_run_of_the_same_class_suspends_nothing_and_fails_for_room(small_host, image, alice, bob, profile, sync_jobs):
    profile(output="7\n", seconds=3600)
    runs = running_runs(sync_jobs, alice)
    late = submit(bob, priority="low", time_limit=600)
    step_until(sync_jobs, lambda: fresh(late).is_final)
    assert fresh(late).state == "error" and "no capacity" in fresh(late).error, fresh(late).error
    assert states(runs) == ["running"] * 3
