"""``manage.py serve``: web + workers as one command (or one role), stopped cleanly by a
signal, and leaving no process behind when it is killed outright."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.processes import ROOT, Child, child_env, free_port, wait_for

pytestmark = pytest.mark.slow


def _healthz(port, path="/healthz"):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
    except OSError:
        return None, None


def _workers(port):
    body = _healthz(port)[1] or {}
    return body.get("checks", {}).get("workers", {}).get("count", 0)


def _parents():
    """{pid: parent pid} of every process, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # The command name (field 2) may hold spaces and parentheses: split after its ")".
                found[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # it exited meanwhile
    return found


def _descendants(pid):
    rows = _parents()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in rows.items() if parent in frontier} - found
        found |= frontier
    return found


def _kill_all(pids):
    """SIGKILL each of ``pids`` and wait until they are gone (their database sessions with them)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not any(_alive(p) for p in pids), 10, "the processes to exit")


def _env(tmp_path, **extra):
    # serve clears its metrics directory when it starts: never the one this test process counts in.
    return child_env(PROMETHEUS_MULTIPROC_DIR=tmp_path / "metrics", **extra)


def _serve(tmp_path, port, *args, name="serve"):
    return Child(
        [sys.executable, "manage.py", "serve", "--port", str(port), *args],
        _env(tmp_path, HEALTHZ_DETAILS="public"),
        tmp_path / f"{name}.log",
    )


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_it_serves_web_and_workers_and_stops_without_orphans(transactional_db, tmp_path, stop_signal):
    port = free_port()
    child = Child(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "1"],
        _env(tmp_path, HEALTHZ_DETAILS="public"),
        tmp_path / "serve.log",
    )
    try:
        # daphne may answer before qcluster's worker has registered: wait for both.
        wait_for(lambda: _healthz(port)[0] == 200, 60, "/healthz to answer 200", child)
        wait_for(lambda: _workers(port) >= 1, 60, "a live worker in /healthz", child)
        family = _descendants(child.pid)
        assert len(family) >= 2  # daphne, qcluster and its pool
        os.kill(child.pid, stop_signal)
        child.proc.wait(timeout=30)
        wait_for(lambda: not any(_alive(p) for p in family), 15, "every child process to exit")
    finally:
        child.stop()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes once reaped by init; check its state.
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")


def test_a_killed_supervisor_leaves_no_process_behind(transactional_db, tmp_path):
    """SIGKILL gives serve no chance to stop its children: they must notice and go by
    themselves (daphne, qcluster, and qcluster's own sentinel, workers and monitor)."""
    port = free_port()
    child = _serve(tmp_path, port, "--workers", "2")
    family = set()
    try:
        wait_for(lambda: _healthz(port)[0] == 200 and _workers(port) >= 2, 60, "web and 2 workers", child)
        family = _descendants(child.pid)
        assert len(family) >= 5, family  # daphne, qcluster, its sentinel/monitor/pusher and 2 workers
        os.kill(child.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
        started = time.monotonic()
        wait_for(lambda: not any(_alive(p) for p in family), 10, f"every process of {sorted(family)} to exit")
        assert time.monotonic() - started < 8
    finally:
        _kill_all(family)
        child.stop()
    # The port is free again, and a new serve starts cleanly beside nothing old.
    again = _serve(tmp_path, port, "--workers", "1", name="serve-again")
    try:
        wait_for(lambda: _healthz(port)[0] == 200 and _workers(port) >= 1, 60, "the new serve", again)
        assert not any(_alive(p) for p in family)
    finally:
        family = _descendants(again.pid)
        again.stop()
        _kill_all(family)


def _manage(*args):
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60
    )


def test_the_roles_run_apart_with_their_own_checks(transactional_db, tmp_path):
    port = free_port()
    web = _serve(tmp_path, port, "--role", "web", name="web")
    worker = Child(
        [sys.executable, "manage.py", "serve", "--role", "worker", "--workers", "1"],
        _env(tmp_path),
        tmp_path / "worker.log",
    )
    family = set()
    try:
        wait_for(lambda: _healthz(port, "/healthz/ready")[0] == 200, 60, "the web role to be ready", web)
        assert _healthz(port, "/healthz/live") == (200, {"status": "ok"})
        assert set(_healthz(port, "/healthz/ready")[1]["checks"]) >= {"database", "migrations"}
        wait_for(lambda: _manage("worker_check", "--ready").returncode == 0, 60, "the worker role to be ready", worker)
        assert _manage("worker_check", "--live").returncode == 0
        # One daphne and no qcluster under the web role; no listener under the worker role.
        web_family, worker_family = _descendants(web.pid), _descendants(worker.pid)
        family = web_family | worker_family
        assert [_cmdline(p) for p in web_family if "qcluster" in _cmdline(p)] == []
        assert [p for p in worker_family if "asgi_server" in _cmdline(p)] == []
        # The web role's /healthz sees the other role's worker, once its cluster has published
        # its status (a worker beats as soon as it spawns, which can be before that).
        wait_for(lambda: _workers(port) >= 1, 30, "the web role to count the worker role's worker", worker)
        worker.stop()
        wait_for(lambda: not any(_alive(p) for p in worker_family), 15, "the worker role to stop")
        result = _manage("worker_check", "--live")
        assert result.returncode == 1 and "no worker process" in result.stderr
    finally:
        web.stop()
        worker.stop()
        _kill_all(family)


def _cmdline(pid):
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_it_refuses_a_busy_port_with_a_clear_message(transactional_db):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "manage.py", "serve", "--port", str(port)],
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert f"127.0.0.1:{port} is busy" in result.stderr


def test_serve_clears_old_metrics_and_forgets_a_killed_web_process(
    transactional_db, tmp_path, alice, monkeypatch, session_cookie
):
    from websockets.sync.client import connect

    from monitoring import metrics
    from tests.monitoring.helpers import stale_live_gauge, websocket_clients

    folder = tmp_path / "metrics"
    folder.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))  # this process scrapes serve's directory
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a pid given again
    port = free_port()
    child, sockets = None, []
    try:
        stale = stale_live_gauge(folder, holder.pid, 3)  # an earlier run's daphne, its pid now holder's
        child = _serve(tmp_path, port, "--role", "web", name="web")
        wait_for(lambda: _healthz(port, "/healthz/live")[0] == 200, 60, "the web role", child)
        assert not stale.exists() and websocket_clients(metrics.render().decode()) == 0
        sockets = [
            connect(
                f"ws://127.0.0.1:{port}/ws/events/",
                additional_headers={"Cookie": session_cookie(alice)},
                origin=f"http://127.0.0.1:{port}",
                open_timeout=10,
            )
            for _ in range(2)
        ]
        wait_for(lambda: websocket_clients(metrics.render().decode()) == 2, 10, "daphne to count its sockets")
        [daphne] = [p for p in _descendants(child.pid) if "asgi_server" in _cmdline(p)]
        os.kill(daphne, signal.SIGKILL)  # no exit handler runs: serve sees it die and stops
        assert child.proc.wait(timeout=30) != 0
        # Before any scrape: serve itself forgot the killed process's live gauge.
        assert list(folder.glob(f"gauge_live*_{daphne}.db")) == []
        assert websocket_clients(metrics.render().decode()) == 0
    finally:
        for ws in sockets:
            ws.close()
        if child is not None:
            child.stop()
        holder.kill()
        holder.wait()
