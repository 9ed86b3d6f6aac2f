"""Through a real web process (daphne): a discovery of a libvirt host that accepts and never
answers gets its 502 within VCLMGR_LIBVIRT_OPEN_TIMEOUT, the process still serves, and it stops on
SIGTERM while the open it gave up on still waits on the peer (no SIGKILL needed)."""

import http.client
import json
import signal
import subprocess
import time

import pytest

from accounts import tokens
from tests import processes
from tests.silent_peer import SilentPeer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def post(port, token, body, timeout=30):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(
            "POST",
            "/api/v1/hypervisors/discover/",
            json.dumps(body),
            {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_served_discovery_of_a_silent_host_answers_and_the_server_still_stops(tmp_path, admin_user):
    token = tokens.issue(admin_user, "t", scopes="all")[1]
    with SilentPeer() as peer:
        child = processes.start_asgi(tmp_path, VCLMGR_LIBVIRT_OPEN_TIMEOUT=1)
        try:
            started = time.monotonic()
            status, body = post(
                child.port, token, {"driver": "libvirt", "uri": f"qemu+tcp://127.0.0.1:{peer.port}/system"}
            )
            assert status == 502 and "no answer within 1 s" in body["error"]["message"], body
            assert time.monotonic() - started < 10 and peer.accepted == 1
            status, _ = post(child.port, token, {"driver": "libvirt", "uri": "test:///default"})
            assert status == 200
            child.proc.send_signal(signal.SIGTERM)
            try:
                child.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the web process ignored SIGTERM:\n{child.output()[-2000:]}")
        finally:
            child.stop()
