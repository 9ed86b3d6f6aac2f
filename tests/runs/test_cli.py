"""``manage.py run``: streams the output and exits with the run's exit status."""

from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command

from runs import services
from runs.management.commands import run as command
from runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def cli(monkeypatch, sync_jobs, tmp_path):
    """The command with this process as the worker: each wait for output runs the jobs. Only the
    command's own ``time`` is replaced: patching ``time.sleep`` itself would make every thread's
    sleep (the job runner's lease heartbeat) run jobs too, outside the test's database access."""
    monkeypatch.setattr(command, "time", SimpleNamespace(sleep=lambda seconds: sync_jobs.drain()))

    def call(*args):
        out, err = StringIO(), StringIO()
        with pytest.raises(SystemExit) as ended:
            call_command(
                "run", "--user", "alice", "--artifacts-dir", str(tmp_path / "got"), *args, stdout=out, stderr=err
            )
        return ended.value.code, out.getvalue(), err.getvalue()

    return call


def test_it_streams_the_output_and_exits_with_the_exit_status(cli, sim_host, image, alice, profile):
    profile(output="3 tests failed\n", exit_status=3)
    code, out, err = cli("--platform", "debian-12", "--timeout", "10m", "--", "make", "test")
    assert code == 3 and out == "3 tests failed\n"
    assert "error: exited with status 3" in err


def test_it_saves_the_artifacts_and_exits_0(cli, sim_host, image, alice, profile, tmp_path):
    profile(output="ok\n", files={"out/junit.xml": "<testsuite/>"})
    source = tmp_path / "in.txt"
    source.write_bytes(b"data")
    code, out, _err = cli(
        "--platform", "debian-12", "--artifact", "out/*.xml", "--input", f"{source}=src/in.txt", "--", "make", "test"
    )
    assert code == 0 and out == "ok\n"
    assert (tmp_path / "got" / "out" / "junit.xml").read_text() == "<testsuite/>"


def test_past_its_time_limit_it_exits_124(cli, settings, sim_host, image, alice, profile):
    settings.RUN_MIN_SECONDS = 1
    profile(output="slow\n", seconds=3600)
    code, _out, err = cli("--platform", "debian-12", "--timeout", "1s", "--", "sleep", "1h")
    assert code == command.EXIT_TIME_LIMIT and "time limit" in err


def test_a_refusal_exits_125_and_says_why(cli, sim_host, image, alice):
    code, _out, err = cli("--platform", "plan9", "--", "true")
    assert code == command.EXIT_VCLMGR and "no image provides the platform 'plan9'" in err
    with pytest.raises(CommandError, match="not a duration"):
        call_command("run", "--user", "alice", "--platform", "debian-12", "--timeout", "soon", "--", "true")
    with pytest.raises(CommandError, match="no active user"):
        call_command("run", "--user", "nobody", "--platform", "debian-12", "--", "true")


def test_keep_failed_keeps_a_failed_runs_vm_and_says_so(cli, sim_host, image, alice, profile):
    profile(output="FAIL\n", exit_status=2)
    code, out, err = cli("--platform", "debian-12", "--keep-failed", "30m", "--capture-failed", "--", "make")
    run = Run.objects.get()
    assert code == 2 and run.keep_failed_minutes == 30 and run.capture_failed
    assert services.kept_vm(run) == run.vm_id and "kept stopped for inspection" in err
