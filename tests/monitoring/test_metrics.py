"""/metrics: who may scrape it, that promtool accepts it, and its numbers after known actions."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from inventory import services as inventory
from reservations import services
from tests.monitoring.helpers import promtool_check, samples, value

H = timedelta(hours=1)
TOKEN = "metrics-token-for-the-test-0123456789"  # noqa: S105 (a test token)


@pytest.fixture
def token(settings):
    settings.METRICS_TOKEN = TOKEN
    return {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}


def scrape(client, headers):
    answer = client.get("/metrics", **headers)
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"].startswith("text/plain; version=0.0.4")
    return answer.content.decode()


@pytest.mark.django_db
def test_it_refuses_a_scrape_without_the_token(client, token):
    missing = client.get("/metrics")
    assert missing.status_code == 401 and missing["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401


@pytest.mark.django_db
def test_it_answers_nobody_when_neither_token_nor_network_is_set(client, settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_NETWORKS = "", []
    answer = client.get("/metrics")
    assert answer.status_code == 403 and b"METRICS_TOKEN" in answer.content


@pytest.mark.django_db
def test_an_allowed_network_needs_no_token(client, settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_NETWORKS = TOKEN, ["127.0.0.0/8"]
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 401


def test_the_page_passes_promtool_and_counts_what_happened(
    make_host, group, image, alice, sync_jobs, client, token, django_capture_on_commit_callbacks
):
    before = samples(scrape(client, token))
    host = make_host("sim-1", driver="sim", cpus=8, memory_mib=8192, disk_gib=200, group=group)
    make_host("sim-2", driver="sim", cpus=8, memory_mib=8192, disk_gib=200, group=group)
    inventory.set_state(host, "drained", "metrics test", actor="test")
    with django_capture_on_commit_callbacks(execute=True):  # jobs are counted once committed
        reservation = services.reserve(alice, image, actor=alice, duration=2 * H)
        sync_jobs.drain()
    with pytest.raises(ValidationError):
        services.reserve(alice, image, actor=alice, duration=H, size={"memory_mib": 64 * 1024})
    text = scrape(client, token)
    ok, output = promtool_check(text)
    assert ok, output
    after = samples(text)
    assert value(after, "vclmgr_hosts", state="online") == 1 and value(after, "vclmgr_hosts", state="drained") == 1
    assert value(after, "vclmgr_reservations", status="ready") == 1
    assert value(after, "vclmgr_vms", state="running") == 1
    # Usable: the online and drained hosts of the group; allocated: the one VM's size.
    assert value(after, "vclmgr_capacity_allocated", group="lab", resource="memory_mib") == reservation.memory_mib
    assert value(after, "vclmgr_capacity_allocated", group="lab", resource="vcpus") == reservation.vcpus
    assert value(after, "vclmgr_capacity_usable", group="lab", resource="memory_mib") >= 2 * 8192
    assert value(after, "vclmgr_job_queue_depth", status="queued") == 0

    def grew(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("vclmgr_job_run_seconds_count", opcode="vm.create", status="success") == 1
    assert grew("vclmgr_provisioning_seconds_count", outcome="success") == 1
    assert grew("vclmgr_job_wait_seconds_count", opcode="vm.create") == 1
    # The build settled its reservation in its last transaction: no settle job ran.
    assert grew("vclmgr_job_run_seconds_count", opcode="reservation.settle", status="success") == 0
    assert grew("vclmgr_placement_refused_total") == 1
    assert grew("vclmgr_placement_refusals_total", reason="lacks_memory_mib") == 1
    assert grew("vclmgr_placement_refusals_total", reason="drained") == 1


def test_a_failed_job_is_counted_by_opcode_and_kind(
    sim_host, image, alice, sync_jobs, client, token, django_capture_on_commit_callbacks
):
    from drivers.sim import services as sim

    before = samples(scrape(client, token))
    sim.set_fault("sim-1", "start", "fail")
    with django_capture_on_commit_callbacks(execute=True):
        services.reserve(alice, image, actor=alice, duration=2 * H)
        sync_jobs.drain()
    after = samples(scrape(client, token))
    failures = {
        labels: v - before.get((name, labels), 0)
        for (name, labels), v in after.items()
        if name == "vclmgr_job_failures_total" and dict(labels)["opcode"] == "vm.create"
    }
    assert sum(failures.values()) >= 1
    assert value(after, "vclmgr_provisioning_seconds_count", outcome="error") > value(
        before, "vclmgr_provisioning_seconds_count", outcome="error"
    )


@pytest.mark.django_db
def test_the_grafana_dashboard_queries_only_metrics_the_page_has(client, token, sim_host):
    import json
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-vclmgr.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(vclmgr_[a-z_]+)", target["expr"])
    }
    from prometheus_client.metrics import MetricWrapperBase

    from core import metrics as counters
    from monitoring import metrics

    # The database gauges are always on the page; counters and histograms once first counted.
    known = set(re.findall(r"^# HELP (vclmgr_[a-z_]+)", scrape(client, token), re.M))
    known |= {
        m._name for module in (counters, metrics) for m in vars(module).values() if isinstance(m, MetricWrapperBase)
    }
    known |= {f"{name}_{part}" for name in known for part in ("bucket", "count", "sum", "total")}
    assert used and used <= known, used - known


def test_the_websocket_gauge_forgets_a_process_that_ended(db, tmp_path, monkeypatch):
    import subprocess
    import sys

    from prometheus_client.parser import text_string_to_metric_families

    from monitoring import metrics
    from tests.processes import wait_for

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    code = (
        "import sys, time; from prometheus_client import Gauge; "
        "Gauge('vclmgr_websocket_clients', 'x', multiprocess_mode='livesum').inc(3); print('up', flush=True); "
        "time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout.readline().strip() == b"up"

        def clients():
            for family in text_string_to_metric_families(metrics.render().decode()):
                if family.name == "vclmgr_websocket_clients":
                    return sum(sample.value for sample in family.samples)
            return 0

        assert clients() == 3
        child.kill()
        child.wait()
        wait_for(lambda: clients() == 0, 5, "the dead process's sockets to be forgotten")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_process_forgets_its_live_gauge_at_exit_and_never_takes_over_a_dead_ones(db, tmp_path, monkeypatch):
    import subprocess
    import sys

    from monitoring import metrics
    from tests.monitoring.helpers import stale_live_gauge, websocket_clients
    from tests.processes import ROOT

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    code = (
        "import os, sys; print(os.getpid(), flush=True); sys.stdin.readline(); "
        "from core import metrics; metrics.WS_CLIENTS.inc(); print('up', flush=True); "
        "sys.stdin.readline()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid = int(child.stdout.readline())
        stale_live_gauge(tmp_path, pid, 3)  # a process that had this pid died with 3 sockets counted
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "up"
        assert websocket_clients(metrics.render().decode()) == 1  # its own socket, not 3 + 1
        child.stdin.write("stop\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
        # It ended normally: its live gauge went, and so did the files in which it counted nothing.
        assert sorted(p.name for p in tmp_path.glob(f"*_{pid}.db")) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_serve_clears_the_directory_at_start_but_not_a_running_serves_files(tmp_path, monkeypatch):
    import subprocess
    import sys

    from core import metrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:

        def leave_files():
            for name in (
                f"counter_{ended}.db",
                f"gauge_livesum_{ended}.db",
                f"counter_{running.pid}.db",
                f"gauge_livesum_{running.pid}.db",
            ):
                (tmp_path / name).write_bytes(b"")
            return {f"counter_{running.pid}.db", f"gauge_livesum_{running.pid}.db"}

        leave_files()
        first = metrics.claim_directory()  # alone: a pid alive now may be another process's; all go
        assert sorted(p.name for p in tmp_path.glob("*.db")) == []
        try:
            kept = leave_files()
            second = metrics.claim_directory()  # beside a running serve: only the ended process's go
            second.close()
            assert {p.name for p in tmp_path.glob("*.db")} == kept
        finally:
            first.close()
    finally:
        running.kill()
        running.wait()
