"""The relay on its own: rows committed late (a smaller id after a larger one) still arrive,
each row once, to the sinks of its topic only."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from vclmgr import events
from vclmgr.models import Event
from vclmgr.relay import LOOKBACK, Relay

pytestmark = pytest.mark.django_db(transaction=True)


def _run(coroutine):
    """Run on a fresh loop in its own thread: a browser test earlier in this process may have
    left an event loop running on the main thread (Playwright's sync API keeps one there)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _collect(relay, topic):
    got = []
    _run(relay.subscribe(topic, got.append))  # its poll task ends with the loop: tests poll
    return got


def _poll(relay):
    _run(relay.poll_once())


def test_it_forwards_rows_committed_after_subscribing_to_that_topic_only():
    events.emit("old", {}, ["user.1"])
    relay = Relay()
    mine, theirs = _collect(relay, "user.1"), _collect(relay, "user.2")
    events.emit("first", {}, ["user.1"])
    _poll(relay)
    events.emit("both", {}, ["user.1", "user.2"])
    events.emit("other", {}, ["user.3"])
    _poll(relay)
    _poll(relay)
    assert [e["kind"] for e in mine] == ["first", "both"]
    assert [e["kind"] for e in theirs] == ["both"]


def test_a_row_committed_after_a_larger_id_is_forwarded_once():
    relay = Relay()
    got = _collect(relay, "user.1")
    _, late, _ = (events.emit("step", {"n": n}, ["user.1"])[0] for n in (1, 2, 3))
    late_id = late.id
    late.delete()  # as if its transaction had not committed yet when the relay read
    _poll(relay)
    assert [e["data"]["n"] for e in got] == [1, 3]
    assert late_id in relay.gaps
    Event.objects.create(id=late_id, topic="user.1", kind="step", data={"n": 2})  # commits now
    _poll(relay)
    _poll(relay)
    assert [e["data"]["n"] for e in got] == [1, 3, 2]
    assert late_id not in relay.gaps


def test_it_stops_waiting_for_ids_more_than_lookback_behind():
    relay = Relay()
    relay.high_water = 10
    relay.advance([12, 13])
    assert (relay.high_water, relay.gaps) == (13, {11})
    relay.advance([13 + LOOKBACK + 5])
    assert relay.gaps == set(range(14 + 5, 13 + LOOKBACK + 5))


def test_one_failing_sink_does_not_starve_the_others():
    relay = Relay()

    def broken(event):
        raise RuntimeError("socket gone")

    _run(relay.subscribe("admin", broken))
    got = _collect(relay, "admin")
    events.emit("step", {}, ["admin"])
    _poll(relay)
    assert [e["kind"] for e in got] == ["step"]


def test_unsubscribed_sinks_get_nothing_more():
    relay = Relay()
    got = _collect(relay, "admin")
    relay.unsubscribe("admin", got.append)
    events.emit("step", {}, ["admin"])
    _poll(relay)
    assert got == [] and relay.subscribers == {}
