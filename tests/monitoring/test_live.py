"""Two live web processes and real workers: scrape /metrics of one after known actions in all."""

import json
import urllib.error
import urllib.request

import pytest
from websockets.sync.client import connect

from accounts import tokens
from reservations.models import Reservation
from tests import processes
from tests.images import sim_image
from tests.monitoring.helpers import promtool_check, samples, value

pytestmark = pytest.mark.slow
TOKEN = "live-metrics-token-0123456789abcdef"  # noqa: S105 (a test token)


def call(url, method="GET", body=None, token=None):
    request = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode() if body else None,
        headers={"Content-Type": "application/json"},
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_of_web_and_worker_processes_add_up(transactional_db, sim_host, image, alice, tmp_path, session_cookie):
    env = {"PROMETHEUS_MULTIPROC_DIR": tmp_path / "metrics", "METRICS_TOKEN": TOKEN}
    (tmp_path / "metrics").mkdir()
    worker = processes.start_worker(tmp_path, workers=2, **env)
    web = processes.start_asgi(tmp_path, **env)
    (tmp_path / "web2").mkdir()
    web2 = processes.start_asgi(tmp_path / "web2", **env)  # a second web process of the machine
    try:
        assert call(f"{web.url}/metrics")[0] == 401
        assert call(f"{web.url}/metrics", token="wrong")[0] == 403  # noqa: S106
        huge = sim_image(
            "huge",
            os="Debian 12",
            min_memory_mib=256,
            default_vcpus=2,
            default_memory_mib=64 * 1024,
            default_disk_gib=10,
        )
        _, clear = tokens.issue(alice, "live", scopes="all")
        status, body = call(
            f"{web.url}/api/v1/reservations/", "POST", {"image": image.pk, "duration_minutes": 60}, token=clear
        )
        assert status == 202, body
        rid = json.loads(body)["reservation"]["id"]
        status, body = call(
            f"{web2.url}/api/v1/reservations/", "POST", {"image": huge.pk, "duration_minutes": 60}, token=clear
        )
        assert status == 400 and "no host has room" in body
        processes.wait_for(lambda: Reservation.objects.get(pk=rid).status == "ready", 60, "the reservation", worker)
        sockets = [  # one on each web process
            connect(
                f"ws://127.0.0.1:{server.port}/ws/events/",
                additional_headers={"Cookie": session_cookie(alice)},
                origin=f"http://127.0.0.1:{server.port}",
                open_timeout=10,
            )
            for server in (web, web2)
        ]

        def scraped():
            status, text = call(f"{web.url}/metrics", token=TOKEN)
            assert status == 200, text
            return text

        # The worker counts a job once its transaction committed: wait for the build's count (its
        # last transaction made the reservation ready).
        def settled():
            found = samples(scraped())
            return value(found, "vclmgr_job_run_seconds_count", opcode="vm.create", status="success") == 1

        processes.wait_for(settled, 30, "the job counts")
        text = scraped()
        ok, output = promtool_check(text)
        assert ok, output
        found = samples(text)
        assert value(found, "vclmgr_reservations", status="ready") == 1
        assert value(found, "vclmgr_hosts", state="online") == 1
        assert value(found, "vclmgr_job_run_seconds_count", opcode="vm.create", status="success") == 1  # worker
        assert value(found, "vclmgr_provisioning_seconds_count", outcome="success") == 1
        assert value(found, "vclmgr_job_wait_seconds_count", opcode="vm.create") == 1
        assert value(found, "vclmgr_placement_refused_total") == 1  # counted by the other web process
        assert value(found, "vclmgr_placement_refusals_total", reason="lacks_memory_mib") == 1
        assert value(found, "vclmgr_websocket_clients") == 2  # one in each web process
        memory = Reservation.objects.get(pk=rid).memory_mib
        assert value(found, "vclmgr_capacity_allocated", group="default", resource="memory_mib") == memory
        for ws in sockets:
            ws.close()
        processes.wait_for(lambda: value(samples(scraped()), "vclmgr_websocket_clients") == 0, 10, "the sockets")
    finally:
        web2.stop()
        web.stop()
        worker.stop()
    # A web process that ended: its sockets no longer count (its counters still do).
    files = sorted(p.name for p in (tmp_path / "metrics").iterdir())
    assert any(name.startswith("histogram_") for name in files)
