"""The relay on its own: rows committed late (a smaller id after a larger one) still arrive,
each row once, to the sinks of its topic only."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from core import events
from core.models import Event
from core.relay import GAP_KEEP_SECONDS, MAX_GAPS, ORDER_WAIT, Relay

pytestmark = pytest.mark.django_db(transaction=True)


def _run(coroutine):
    """Run on a fresh loop in its own thread: a browser test earlier in this process may have
    left an event loop running on the main thread (Playwright's sync API keeps one there)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _relay(clock=None):
    """A relay past its first read (which waits for no gap: ids an earlier test used are none)."""
    relay = Relay()
    relay.clock = clock or relay.clock
    _run(relay.ensure_running())
    events.emit("warm-up", {}, ["nobody"])
    _poll(relay)
    return relay


def _collect(relay, topic):
    got = []
    _run(relay.subscribe(topic, got.append))  # its poll task ends with the loop: tests poll
    return got


def _poll(relay):
    _run(relay.poll_once())


def test_it_forwards_rows_committed_after_subscribing_to_that_topic_only():
    events.emit("old", {}, ["user.1"])
    relay = _relay()
    mine, theirs = _collect(relay, "user.1"), _collect(relay, "user.2")
    events.emit("first", {}, ["user.1"])
    _poll(relay)
    events.emit("both", {}, ["user.1", "user.2"])
    events.emit("other", {}, ["user.3"])
    _poll(relay)
    _poll(relay)
    assert [e["kind"] for e in mine] == ["first", "both"]
    assert [e["kind"] for e in theirs] == ["both"]


def test_a_row_committed_after_a_larger_id_is_forwarded_once_and_in_order():
    relay = _relay()
    got = _collect(relay, "user.1")
    _, late, _ = (events.emit("step", {"n": n}, ["user.1"])[0] for n in (1, 2, 3))
    late_id = late.id
    late.delete()  # as if its transaction had not committed yet when the relay read
    _poll(relay)
    # 3 waits behind 2: a client holding 3 could resume from it elsewhere and never get 2.
    assert [e["data"]["n"] for e in got] == [1]
    assert late_id in relay.gaps and relay.delivered_through == late_id - 1
    Event.objects.create(id=late_id, topic="user.1", kind="step", data={"n": 2})  # commits now
    _poll(relay)
    _poll(relay)
    assert [e["data"]["n"] for e in got] == [1, 2, 3]
    assert late_id not in relay.gaps and relay.delivered_through == late_id + 1


def test_rows_stop_waiting_behind_a_gap_older_than_order_wait():
    now = [1000.0]
    relay = _relay(clock=lambda: now[0])
    got = _collect(relay, "user.1")
    _, gone, _ = (events.emit("step", {"n": n}, ["user.1"])[0] for n in (1, 2, 3))
    gone_id = gone.id
    gone.delete()  # a rolled-back insert: its id never commits
    _poll(relay)
    assert [e["data"]["n"] for e in got] == [1]
    now[0] += ORDER_WAIT + 0.1
    _poll(relay)
    assert [e["data"]["n"] for e in got] == [1, 3]
    Event.objects.create(id=gone_id, topic="user.1", kind="step", data={"n": 2})  # committed after all
    _poll(relay)
    assert [e["data"]["n"] for e in got] == [1, 3, 2]  # late, but not lost


def test_a_resumed_subscriber_replays_only_what_the_relay_handed_on():
    relay = _relay()
    _collect(relay, "user.1")
    first, late, third = (events.emit("step", {"n": n}, ["user.1"])[0] for n in (1, 2, 3))
    late.delete()
    _poll(relay)
    replayed = events.since(["user.1"], 0, through=relay.delivered_through)
    assert [e.id for e in replayed] == [first.id]  # 3 comes live, after 2


def test_it_awaits_a_skipped_id_for_gap_keep_seconds_however_many_ids_come_after_it():
    now = [1000.0]
    relay = Relay()
    relay.clock = lambda: now[0]
    relay.high_water, relay.settled = 10, True
    relay.advance([12, 13])
    assert (relay.high_water, relay.gaps) == (13, {11})
    relay.advance(list(range(14, 3014)))  # a slow transaction's id, 3,000 ids later: still awaited
    now[0] += GAP_KEEP_SECONDS - 1
    relay.advance([3014])
    assert relay.gaps == {11}
    now[0] += 2
    relay.advance([3015])
    assert relay.gaps == set()  # given up: taken for a rolled-back insert


def test_a_late_commit_thousands_of_ids_behind_still_arrives():
    relay = _relay()
    got = _collect(relay, "user.1")
    slow = events.emit("step", {"n": 0}, ["user.1"])[0]
    slow_id = slow.id
    slow.delete()  # not committed yet, as far as the relay can tell
    Event.objects.bulk_create(Event(topic="other", kind="step", data={}) for _ in range(2000))
    _poll(relay)
    Event.objects.create(id=slow_id, topic="user.1", kind="step", data={"n": 0})  # it commits now
    _poll(relay)
    assert [e["id"] for e in got] == [slow_id]


def test_the_gaps_kept_are_bounded():
    relay = Relay()
    relay.high_water, relay.settled = 0, True
    relay.advance([MAX_GAPS * 3])
    assert MAX_GAPS - 1 <= len(relay.gaps) <= MAX_GAPS and max(relay.gaps) == MAX_GAPS * 3 - 1  # the newest


def test_one_failing_sink_does_not_starve_the_others():
    relay = _relay()

    def broken(event):
        raise RuntimeError("socket gone")

    _run(relay.subscribe("admin", broken))
    got = _collect(relay, "admin")
    events.emit("step", {}, ["admin"])
    _poll(relay)
    assert [e["kind"] for e in got] == ["step"]


def test_unsubscribed_sinks_get_nothing_more():
    relay = _relay()
    got = _collect(relay, "admin")
    relay.unsubscribe("admin", got.append)
    events.emit("step", {}, ["admin"])
    _poll(relay)
    assert got == [] and relay.subscribers == {}
