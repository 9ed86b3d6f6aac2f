"""``manage.py serve``: web + workers as one command, stopped cleanly by a signal."""

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.processes import ROOT, Child, child_env, free_port, wait_for

pytestmark = pytest.mark.slow


def _healthz(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
    except OSError:
        return None, None


def _workers(port):
    body = _healthz(port)[1] or {}
    return body.get("checks", {}).get("workers", {}).get("count", 0)


def _descendants(pid):
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,sid="], capture_output=True, text=True).stdout
    rows = [tuple(map(int, line.split())) for line in out.splitlines() if line.strip()]
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent, _ in rows if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_it_serves_web_and_workers_and_stops_without_orphans(transactional_db, tmp_path, stop_signal):
    port = free_port()
    child = Child([sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "1"],
                  child_env(HEALTHZ_DETAILS="public"), tmp_path / "serve.log")
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


def test_it_refuses_a_busy_port_with_a_clear_message(transactional_db):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "manage.py", "serve", "--port", str(port)],
            cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60,
        )
    assert result.returncode != 0
    assert f"127.0.0.1:{port} is busy" in result.stderr
