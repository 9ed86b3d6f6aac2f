"""Events cross processes: a change made in a worker reaches a websocket client in the
ASGI process within a second, on the embedded default and with Redis alike."""

import time
from datetime import datetime

import pytest
from django.db import transaction
from django_q.tasks import async_task
from websockets.exceptions import ConnectionClosed, InvalidStatus

from core import events
from tests import processes

pytestmark = pytest.mark.slow

# One daphne for the module: what the tests prove is what a running server relays and refuses,
# not how it starts; what it keeps between tests is in the database (see committed_db).
asgi_process = processes.shared(processes.start_asgi)
transactional_db, db = processes.committed_db, processes.committed_db_too


@pytest.fixture
def asgi_server(transactional_db, asgi_process):
    return asgi_process.begin()


def test_an_event_emitted_in_a_worker_reaches_the_browser_within_a_second(
    admin_user, session_cookie, ws_connect, worker, asgi_server
):
    ws = ws_connect(cookie=session_cookie(admin_user))
    assert ws.subscribe(["admin"])["topics"] == ["admin"]
    async_task("core.tasks.ping", "admin")
    event = ws.receive_until(lambda m: m["type"] == "event", timeout=15)
    received = time.time()
    assert event["kind"] == "worker.pong"
    assert event["data"]["pid"] not in {asgi_server.pid, worker.pid, __import__("os").getpid()}
    latency = received - datetime.fromisoformat(event["time"]).timestamp()
    assert latency < 1.0, f"event took {latency:.2f}s"


def test_a_reconnecting_client_resumes_without_missing_events(alice, session_cookie, ws_connect):
    topic = f"user.{alice.pk}"
    cookie = session_cookie(alice)
    ws = ws_connect(cookie=cookie)
    last_id = ws.subscribe([topic])["last_id"]
    with transaction.atomic():
        events.emit("step", {"n": 1}, [topic])
    first = ws.receive_until(lambda m: m["type"] == "event")
    assert first["data"] == {"n": 1} and first["id"] > last_id
    ws.close()
    for n in (2, 3, 4):  # while the client is away
        events.emit("step", {"n": n}, [topic])
    ws = ws_connect(cookie=cookie)
    ws.subscribe([topic], since=first["id"])
    replayed = [ws.receive_until(lambda m: m["type"] == "event")["data"]["n"] for _ in range(3)]
    assert replayed == [2, 3, 4]
    events.emit("step", {"n": 5}, [topic])
    assert ws.receive_until(lambda m: m["type"] == "event")["data"]["n"] == 5


def test_a_user_cannot_follow_another_users_or_the_admin_stream(alice, bob, session_cookie, ws_connect):
    ws = ws_connect(cookie=session_cookie(alice))
    reply = ws.subscribe([f"user.{bob.pk}", "admin", f"user.{alice.pk}"])
    assert reply["denied"] == [f"user.{bob.pk}", "admin"]
    assert reply["topics"] == [f"user.{alice.pk}"]
    events.emit("secret", {"for": "bob"}, [f"user.{bob.pk}", "admin"])
    events.emit("mine", {"for": "alice"}, [f"user.{alice.pk}"])
    assert ws.receive_until(lambda m: m["type"] == "event")["data"] == {"for": "alice"}


def test_anonymous_sockets_are_closed(ws_connect):
    ws = ws_connect()
    with pytest.raises(ConnectionClosed) as closed:
        ws.receive(timeout=5)
    assert closed.value.rcvd.code == 4401


def test_foreign_origins_are_refused(alice, session_cookie, ws_connect):
    with pytest.raises(InvalidStatus):
        ws_connect(cookie=session_cookie(alice), origin="http://evil.example.com")


def test_api_tokens_open_sockets_for_integrations(alice, ws_connect):
    from accounts import tokens

    _, clear = tokens.issue(alice, "ws")
    ws = ws_connect(headers={"Authorization": f"Bearer {clear}"})
    assert ws.subscribe([f"user.{alice.pk}"])["topics"] == [f"user.{alice.pk}"]


def test_a_burst_of_events_arrives_complete_and_in_order(alice, session_cookie, ws_connect):
    # More than a channel layer queues per socket (100): the relay must neither drop nor reorder.
    topic = f"user.{alice.pk}"
    ws = ws_connect(cookie=session_cookie(alice))
    ws.subscribe([topic])
    with transaction.atomic():
        for n in range(300):
            events.emit("step", {"n": n}, [topic])
    received = [ws.receive_until(lambda m: m["type"] == "event", timeout=15)["data"]["n"] for _ in range(300)]
    assert received == list(range(300))
