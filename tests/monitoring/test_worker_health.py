"""Worker beats and ``worker_check``'s verdicts (the real processes: tests/vclmgr/test_serve.py)."""

import json
import os
import time

import pytest
from django.core.management import call_command

from monitoring import worker_health


@pytest.fixture
def beats(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    return tmp_path / "run" / settings.Q_CLUSTER["name"]


def _check(*flags):
    try:
        call_command("worker_check", *flags)
    except SystemExit as exit:
        return exit.code
    return 0


@pytest.mark.django_db
def test_a_fresh_beat_is_live_and_ready(beats):
    record = worker_health.beat()
    assert record["database"] == record["broker"] == "ok"
    assert json.loads((beats / f"worker-{os.getpid()}.json").read_text())["pid"] == os.getpid()
    assert _check("--live") == 0 and _check("--ready") == 0


@pytest.mark.django_db
def test_no_beat_is_neither(beats, capsys):
    assert _check("--live") == 1
    assert "no worker process" in capsys.readouterr().err


@pytest.mark.django_db
def test_a_stale_beat_or_a_dead_pid_is_not_live(beats):
    worker_health.beat()
    path = beats / f"worker-{os.getpid()}.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "time": time.time() - worker_health.STALE_SECONDS - 1}))
    assert _check("--live") == 1
    path.write_text(json.dumps({**record, "pid": 2**22 + 1}))  # above Linux's pid_max default
    assert _check("--live") == 1


@pytest.mark.django_db
def test_a_worker_cut_off_from_the_database_is_live_not_ready(beats, capsys):
    worker_health.beat()
    path = beats / f"worker-{os.getpid()}.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "database": "OperationalError: connection refused"}))
    assert _check("--live") == 0
    assert _check("--ready") == 1
    assert "database: OperationalError" in capsys.readouterr().err
