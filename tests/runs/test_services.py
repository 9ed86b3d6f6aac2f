"""Batch runs on the simulator at zero delay: the state machine, its faults, bad input."""

import os
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from capacity.models import Allocation
from drivers.sim import services as sim
from drivers.sim.models import SimVM
from jobs import transitions
from jobs.models import Job, QueueSettings
from provisioning import services as vms
from provisioning.models import VM, QuotaRule
from runs import services
from runs.models import Run, RunFile
from tests.runs.helpers import fresh, submit

pytestmark = pytest.mark.django_db


def output(run):
    return b"".join(bytes(c.data) for c in run.output.order_by("seq"))


def assert_clean(run):
    """No VM on the host, the VM row destroyed, no live claim."""
    run = fresh(run)
    assert not SimVM.objects.exists()
    if run.vm_id:
        assert run.vm.state == VM.State.DESTROYED
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_run_that_exits_0_succeeds_with_its_output_and_leaves_nothing(sim_host, image, alice, profile, sync_jobs):
    profile(output="building\nok\n", exit_status=0)
    run = submit(alice)
    assert run.state == "queued" and run.image == image and run.vcpus == 2 and run.memory_mib == 1024
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "success", run.reason
    assert run.exit_status == 0 and output(run) == b"building\nok\n"
    assert [entry[1] for entry in run.reason][-1] == "exited with status 0"
    job = Job.objects.get(pk=run.job)
    assert job.status == "success", job.error_message
    assert_clean(run)


def test_a_run_that_exits_3_is_an_error_with_that_exit_status(sim_host, image, alice, profile, sync_jobs):
    profile(output="FAIL: 1 test\n", exit_status=3)
    run = submit(alice)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "error" and run.exit_status == 3 and "exited with status 3" in run.error
    assert_clean(run)


def test_the_default_sim_result_names_the_command_and_runs_nothing(sim_host, image, alice, sync_jobs):
    run = submit(alice, argv=["sh", "-c", "rm -rf / ; echo pwned"])
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "success"
    assert output(run) == b"sim: sh -c 'rm -rf / ; echo pwned'\n"


def test_output_past_the_limit_is_truncated_and_says_so(settings, sim_host, image, alice, profile, sync_jobs):
    settings.RUN_OUTPUT_MAX_BYTES = 1024
    profile(output="x" * 99 + "\n", repeat=50)  # 5000 bytes
    run = submit(alice)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "success" and run.output_seen == 5000 and run.output_kept == 1024
    assert run.truncated and len(output(run)) == 1024
    assert "1024 bytes kept of 5000" in services.truncation_note(run)


def test_output_that_is_not_utf8_is_kept_as_bytes(sim_host, image, alice, profile, sync_jobs):
    profile(output="caf", output_hex="e9ff0a")
    run = submit(alice)
    sync_jobs.drain()
    assert output(fresh(run)) == b"caf\xe9\xff\n"


def test_an_input_file_goes_in_and_artifacts_matching_the_patterns_come_out(sim_host, image, alice, profile, sync_jobs):
    profile(files={"out/report.xml": "<ok/>", "out/deep/x.xml": "no", "notes.txt": "n"})
    run = submit(alice, inputs={"data/in.txt": b"hello"}, artifacts=["out/*.xml"])
    job_inputs = RunFile.objects.get(run=run, kind="input")
    assert services.storage().open(job_inputs.stored).read() == b"hello"
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "success", run.reason
    artifacts = {f.path: services.storage().open(f.stored).read() for f in run.files.filter(kind="artifact")}
    assert artifacts == {"out/report.xml": b"<ok/>"}
    assert_clean(run)


def test_a_script_runs_through_the_shell(sim_host, image, alice, sync_jobs):
    run = submit(alice, argv=None, script="echo one\necho two\n")
    sync_jobs.drain()
    assert output(fresh(run)) == b"sim: /bin/sh /tmp/vclmgr-run-script.sh\n"


def test_a_run_past_its_time_limit_is_killed_and_its_vm_destroyed(settings, sim_host, image, alice, profile, sync_jobs):
    settings.RUN_MIN_SECONDS = 1
    profile(output="working\n", seconds=3600)
    run = submit(alice, time_limit=1)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "error" and run.exit_status is None
    assert "time limit of 1 s" in run.error
    assert_clean(run)


def test_a_queued_run_canceled_ends_at_once_and_builds_nothing(sim_host, image, alice, sync_jobs):
    run = submit(alice)
    services.cancel(run, actor=alice)
    assert fresh(run).state == "canceled"
    sync_jobs.drain()
    assert fresh(run).vm_id is None and not VM.objects.exists()


def test_a_running_run_canceled_stops_and_its_vm_is_destroyed(sim_host, image, alice, profile, sync_jobs):
    profile(output="working\n", seconds=3600)
    run = submit(alice, time_limit=600)
    for _ in range(30):  # one step per execution (no time budget): stop once the command runs
        sync_jobs.run_one(budget=0) if not sync_jobs.handoffs else sync_jobs.drain(limit=1, budget=0)
        if fresh(run).state == "running":
            break
    assert fresh(run).state == "running"
    services.cancel(fresh(run), actor=alice)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "canceled", run.reason
    assert "canceled by" in " ".join(entry[1] for entry in run.reason)
    assert_clean(run)


def test_a_job_canceled_by_staff_also_destroys_the_vm(sim_host, image, alice, admin_user, profile, sync_jobs):
    from jobs import services as jobs

    profile(output="working\n", seconds=3600)
    run = submit(alice, time_limit=600)
    for _ in range(30):
        sync_jobs.run_one(budget=0) if not sync_jobs.handoffs else sync_jobs.drain(limit=1, budget=0)
        if fresh(run).state == "running":
            break
    jobs.cancel(Job.objects.get(pk=run.job), actor=admin_user)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "canceled"
    assert_clean(run)


def test_a_failed_build_is_an_error_with_the_reason_and_leaves_nothing(sim_host, image, alice, sync_jobs):
    sim.set_fault("sim-1", "start", "fail", actor="test")
    run = submit(alice)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "error" and "could not be built" in run.error and "injected failure" in run.error
    assert_clean(run)


def test_a_guest_channel_fault_mid_run_still_destroys_the_vm(sim_host, image, alice, sync_jobs):
    sim.set_fault("sim-1", "guest_exec", "fail", actor="test")
    run = submit(alice)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "error" and "injected failure" in run.error
    assert_clean(run)


def test_a_transient_status_fault_is_retried_and_the_run_finishes(sim_host, image, alice, profile, sync_jobs):
    profile(output="ok\n")
    sim.set_fault("sim-1", "guest_exec_status", "fail_once", actor="test")
    run = submit(alice)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "success", run.reason  # a temporary error while waiting is asked again
    assert output(run) == b"ok\n"
    assert_clean(run)


# --- bad input: clear refusals, nothing created ---------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"platform": "plan9"}, "platform", "no image provides the platform 'plan9'"),
        ({"platform": "debian-12/arm64"}, "platform", "no image provides"),
        ({"argv": []}, "command", "the command is empty"),
        ({"argv": None, "script": "   "}, "command", "the command is empty"),
        ({"argv": ["x" * 70000]}, "command", "at most 65536"),
        ({"artifacts": ["../etc/passwd"]}, "artifacts", "cannot leave the work directory"),
        ({"artifacts": ["/etc/*"]}, "artifacts", "relative path"),
        ({"artifacts": ["out/../../x"]}, "artifacts", "cannot leave"),
        ({"inputs": {"../x": b"1"}}, "inputs", "cannot leave"),
        ({"time_limit": 5}, "time_limit", "10 to 21600 seconds"),
        ({"time_limit": 10**6}, "time_limit", "10 to 21600 seconds"),
        ({"env": {"1BAD": "x"}}, "env", "not a variable name"),
        ({"priority": "urgent"}, "priority", "one of"),
    ],
)
def test_it_refuses_bad_input_and_creates_nothing(sim_host, image, alice, kwargs, field, words):
    with pytest.raises(ValidationError) as caught:
        submit(alice, **kwargs)
    assert words in " ".join(caught.value.message_dict[field])
    assert not Run.objects.exists() and not Job.objects.exists()


def test_it_refuses_input_files_over_the_size_limit(settings, sim_host, image, alice):
    settings.RUN_INPUT_MAX_BYTES = 10
    with pytest.raises(ValidationError) as caught:
        submit(alice, inputs={"a.bin": b"x" * 6, "b.bin": b"y" * 6})
    assert "over the limit of 10 bytes" in caught.value.message_dict["inputs"][0]
    assert not Run.objects.exists() and not os.path.exists(services.storage().location)


def test_a_platform_whose_image_no_online_host_can_run_is_explained(make_host, alice):
    for n in range(3):
        make_host(f"kvm-{n}", driver="libvirt", uri="test:///default")
    image = vms.create_image(actor="test", name="debian-12-vmw", os="Debian 12")
    vms.add_variant(image, actor="test", hypervisor_type="vmware", format="vmdk", location="[ds] d.vmdk")
    with pytest.raises(ValidationError) as caught:
        submit(alice)
    assert caught.value.message_dict["platform"] == ["no host: 3 lack a kvm variant of debian-12-vmw"]


def test_the_quota_counts_runs_like_reservations_and_names_the_rule(sim_host, image, alice):
    group = Group.objects.create(name="students")
    alice.groups.add(group)
    QuotaRule.objects.create(name="students", group=group, max_vcpus=3)
    submit(alice)  # 2 vCPUs
    with pytest.raises(ValidationError) as caught:
        submit(alice)
    message = " ".join(caught.value.messages)
    assert "already holds 2 vCPUs" in message and "rule 'students'" in message
    assert Run.objects.count() == 1


def test_the_per_user_default_counts_queued_runs(settings, sim_host, image, alice):
    settings.RESERVATION_MAX_PER_USER = 1
    submit(alice)
    with pytest.raises(ValidationError) as caught:
        submit(alice)
    assert "at most 1 (the site default)" in " ".join(caught.value.messages)


def test_an_image_the_user_may_not_use_is_refused(sim_host, image, alice):
    vms.update_image(image, actor="test", visibility="restricted")
    with pytest.raises(ValidationError) as caught:
        submit(alice)
    assert "no image provides" in caught.value.message_dict["platform"][0]
    with pytest.raises(ValidationError):
        submit(alice, platform="", image=image)


def test_another_users_run_is_not_visible_and_its_topic_refused(sim_host, image, alice, bob, admin_user):
    run = submit(alice)
    assert not services.visible(bob).filter(pk=run.pk).exists()
    assert services.visible(admin_user).filter(pk=run.pk).exists()
    assert services.may_see(alice, str(run.pk)) and not services.may_see(bob, str(run.pk))
    assert not services.may_see(bob, "1; drop")


# --- a worker lost mid-run ------------------------------------------------------------------


def _start_then_lose_the_worker(run, sync_jobs):
    """Run the job step by step until the command runs, then drop the worker's continuation
    and expire its lease, as a worker killed with SIGKILL leaves it."""
    for _ in range(30):
        sync_jobs.run_one(budget=0) if not sync_jobs.handoffs else sync_jobs.drain(limit=1, budget=0)
        if fresh(run).state == "running":
            break
    assert fresh(run).state == "running"
    sync_jobs.handoffs.clear()
    Job.objects.filter(pk=run.job).update(lease_until=timezone.now() - timedelta(minutes=1))


def _recover(job_id, max_attempts):
    with transaction.atomic():
        QueueSettings.lock()
        return transitions.recover(job_id, max_attempts)


def test_a_lost_worker_with_attempts_left_resumes_the_run(sim_host, image, alice, profile, sync_jobs):
    profile(output="slow but fine\n", seconds=0.5)
    run = submit(alice)
    _start_then_lose_the_worker(run, sync_jobs)
    assert _recover(run.job, max_attempts=3).status == "queued"
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "success", run.reason
    assert output(run) == b"slow but fine\n"  # read once, though two workers read it
    assert SimVM.objects.count() == 0 and VM.objects.filter(state="destroyed").count() == 1
    assert_clean(run)


def test_a_lost_worker_on_its_last_attempt_still_gets_the_vm_destroyed(
    sim_host, image, alice, profile, sync_jobs, django_capture_on_commit_callbacks
):
    profile(output="working\n", seconds=3600)
    run = submit(alice, time_limit=600)
    _start_then_lose_the_worker(run, sync_jobs)
    with django_capture_on_commit_callbacks(execute=True):
        assert _recover(run.job, max_attempts=1).status == "error"
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "error" and "its job ended before the run did" in run.error and "giving up" in run.error
    assert_clean(run)


def test_a_finished_run_mails_its_owner_once(sim_host, image, alice, profile, sync_jobs, mailoutbox):
    from notifications import tasks
    from notifications.models import Notification

    profile(exit_status=3, output="3 tests failed\n")
    run = submit(alice)
    sync_jobs.drain()
    assert fresh(run).state == "error"
    assert tasks.send_due()["mail"] == 1
    [mail] = mailoutbox
    assert mail.to == ["alice@example.org"]
    assert mail.subject == f"Your run {run.pk} finished: error"
    assert "finished with status error" in mail.body and "exited with status 3" in mail.body, mail.body
    assert Notification.objects.get(user=alice, kind="run_finished").state == "sent"
    assert tasks.send_due()["mail"] == 0


def test_artifact_names_a_guest_makes_up_are_skipped_and_nothing_is_stored_outside(
    sim_host, image, alice, profile, sync_jobs
):
    # The guest lists what it likes: a name climbing out of the work directory, one with a
    # space, one plain. Only the plain one is fetched and stored, under the run's own folder.
    profile(files={"../escape.xml": "no", "out/a b.xml": "no", "out/ok.xml": "<ok/>"})
    run = submit(alice, artifacts=["*/*"])
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "success", run.reason
    [kept] = run.files.filter(kind="artifact")
    assert (kept.path, kept.stored) == ("out/ok.xml", f"{run.pk}/artifact/out/ok.xml")
    trail = " ".join(str(entry) for entry in run.reason)
    assert "2 artifacts skipped, not plain paths: '../escape.xml', 'out/a b.xml'" in trail


def test_a_guest_listing_more_artifacts_than_allowed_gets_the_first_kept_and_one_line_said(
    sim_host, image, alice, profile, sync_jobs, settings
):
    settings.RUN_ARTIFACT_MAX_FILES = 3
    files = {f"out/{i:03d}.xml": "<ok/>" for i in range(8)} | {f"out/bad {i}.xml": "no" for i in range(50)}
    profile(files=files)
    run = submit(alice, artifacts=["out/*"])
    before = len(fresh(run).reason)
    sync_jobs.drain()
    run = fresh(run)
    assert run.state == "success", run.reason
    assert sorted(run.files.filter(kind="artifact").values_list("path", flat=True)) == [
        "out/000.xml",
        "out/001.xml",
        "out/002.xml",
    ]
    trail = [str(entry) for entry in run.reason[before:]]
    assert sum("artifact" in entry for entry in trail) == 2, trail  # not one line per name
    assert any("5 artifacts past the first 3 not kept (RUN_ARTIFACT_MAX_FILES)" in entry for entry in trail)
    assert any("50 artifacts skipped, not plain paths: 'out/bad 0.xml', 'out/bad 1.xml', " in entry for entry in trail)
