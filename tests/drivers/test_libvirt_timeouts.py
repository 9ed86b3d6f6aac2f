"""libvirt against a silent peer (tests/silent_peer.py): an open gives up after
VCLMGR_LIBVIRT_OPEN_TIMEOUT, the thread it leaves ends when the peer hangs up, and a process
never holds more than MAX_OPENING such threads."""

import threading

from drivers import registry
from drivers.base import Unreachable
from drivers.libvirt import connection
from tests.silent_peer import outcome_within, wait_for


def uri(peer):
    return f"qemu+tcp://127.0.0.1:{peer.port}/system"


def facts(peer):
    with registry.get_driver("libvirt", uri(peer)) as driver:
        return driver.facts()


def open_threads():
    return [t for t in threading.enumerate() if t.name == "libvirt-open" and t.is_alive()]


def test_an_open_to_a_silent_peer_fails_within_its_timeout(silent_libvirt):
    peer = silent_libvirt()
    _, error, took = outcome_within(10, facts, peer)
    assert isinstance(error, Unreachable) and not error.permanent
    assert str(error) == f"cannot connect to {uri(peer)}: no answer within 0.5 s"
    assert peer.received > 0  # libvirt did connect and speak: it is the answer that never came
    assert took < 5


def test_the_thread_of_a_given_up_open_ends_when_the_peer_hangs_up(silent_libvirt):
    peer = silent_libvirt()
    before = len(open_threads())
    outcome_within(10, facts, peer)
    assert connection._opening.under_way() == 1 and len(open_threads()) == before + 1
    peer.close()
    wait_for(lambda: connection._opening.under_way() == 0 and len(open_threads()) == before, "the open ends")


def test_a_peer_holding_a_given_up_open_is_refused_at_once(silent_libvirt):
    peer = silent_libvirt()
    outcome_within(10, facts, peer)
    _, error, took = outcome_within(10, facts, peer)
    assert isinstance(error, Unreachable) and "an earlier connection to it has not answered yet" in str(error)
    assert took < 0.4 and connection._opening.under_way() == 1  # no second thread on the same peer


def test_a_process_holds_at_most_MAX_OPENING_hung_opens(silent_libvirt, monkeypatch):
    monkeypatch.setattr(connection, "MAX_OPENING", 2)
    for _ in range(2):
        outcome_within(10, facts, silent_libvirt())
    _, error, took = outcome_within(10, facts, silent_libvirt())
    assert isinstance(error, Unreachable) and "2 libvirt connections are still opening" in str(error)
    assert took < 0.4 and connection._opening.under_way() == 2


def test_other_hosts_open_while_a_silent_one_is_being_given_up_on(silent_libvirt, settings):
    settings.VCLMGR_LIBVIRT_OPEN_TIMEOUT = 3
    peer = silent_libvirt()
    hanging = threading.Thread(target=lambda: outcome_within(10, facts, peer), daemon=True)
    hanging.start()
    wait_for(lambda: peer.accepted, "the silent peer is asked")
    result, error, took = outcome_within(10, lambda: registry.get_driver("libvirt", "test:///default").facts())
    assert error is None and result.cpus > 0
    assert took < 2  # not queued behind the silent host's open
    hanging.join(10)
