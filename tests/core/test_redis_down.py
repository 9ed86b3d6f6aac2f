"""The API keeps answering on the database when Redis goes away: throttling fails open to a
local-memory cache, and only /healthz says something is down."""

import json
import urllib.error
import urllib.request

import pytest

from accounts import tokens
from tests import processes

pytestmark = pytest.mark.slow


def _get(url, token=None, body=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(url, headers=headers, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (loopback)
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def redis_and_server(transactional_db, tmp_path):
    redis = processes.start_redis(tmp_path)
    server = None
    try:
        server = processes.start_asgi(tmp_path, REDIS_URL=redis.url)
        yield redis, server
    finally:
        if server is not None:
            server.stop()
        redis.stop()


def test_the_api_answers_while_redis_is_down(redis_and_server, alice):
    redis, server = redis_and_server
    _, token = tokens.issue(alice, "while redis is down", scopes="all")
    assert _get(f"{server.url}/api/v1/reservations/", token)[0] == 200
    assert _get(f"{server.url}/api/v1/images/")[0] == 401  # anonymous: the throttle's other path

    redis.stop()

    for _ in range(3):
        status, body = _get(f"{server.url}/api/v1/reservations/", token)
        assert status == 200, body
    assert _get(f"{server.url}/api/v1/images/")[0] == 401
    # A write too: the job is in the database; workers are woken when the broker is back.
    status, body = _get(f"{server.url}/api/v1/jobs/", token, {"opcode": "noop"})
    assert status == 202, body
    assert _get(f"{server.url}/healthz")[0] == 503
    log = server.output()
    assert log.count("throttling falls back to a local-memory cache") == 1, log[-3000:]
    assert "Internal Server Error" not in log, log[-3000:]
