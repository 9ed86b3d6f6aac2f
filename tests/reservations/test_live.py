"""A reservation's live stream over the real websocket server: own only, resumable."""

from datetime import timedelta

import pytest
from django.utils import timezone

from reservations import services

pytestmark = pytest.mark.slow


def test_only_the_owner_follows_a_reservation_and_resumes_after_a_reconnect(
    sim_host, image, alice, bob, session_cookie, ws_connect
):
    reservation = services.reserve(
        alice, image, actor=alice, start=timezone.now() + timedelta(hours=2), duration=timedelta(hours=1)
    )
    topic = f"reservation.{reservation.pk}"
    spy = ws_connect(cookie=session_cookie(bob))
    assert spy.subscribe([topic])["denied"] == [topic]
    cookie = session_cookie(alice)
    ws = ws_connect(cookie=cookie)
    assert ws.subscribe([topic, f"user.{alice.pk}"])["topics"] == [topic, f"user.{alice.pk}"]
    services.extend(reservation, reservation.end + timedelta(hours=1), actor=alice)
    changed = ws.receive_until(lambda m: m["type"] == "event" and m["kind"] == "reservation.changed")
    assert changed["data"]["id"] == reservation.pk and "extended" in changed["data"]["reason"]
    ws.close()
    services.cancel(reservation, actor=alice)  # while the client is away
    ws = ws_connect(cookie=cookie)
    ws.subscribe([topic], since=changed["id"])
    missed = ws.receive_until(lambda m: m["type"] == "event" and m["kind"] == "reservation.changed")
    assert missed["data"]["status"] == "canceled"
    with pytest.raises(TimeoutError):  # the refused subscriber got nothing of it
        spy.receive_until(lambda m: m["type"] == "event", timeout=1)
