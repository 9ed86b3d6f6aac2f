"""``core.periodic``: Schedules that must exist, and the daemon-thread loop."""

import pytest
from django_q.models import Schedule

from core import periodic
from tests.jobs.helpers import wait_until

NAME, FUNC = "vclmgr: test schedule", "core.tasks.nothing"


def _rows():
    return list(Schedule.objects.filter(name=NAME).values_list("func", "minutes", "schedule_type"))


@pytest.mark.django_db
def test_ensure_schedule_creates_dedupes_retimes_and_removes():
    first = periodic.ensure_schedule(NAME, FUNC, 3)
    assert periodic.ensure_schedule(NAME, FUNC, 3).pk == first.pk
    assert _rows() == [(FUNC, 3, Schedule.MINUTES)]
    Schedule.objects.create(name=NAME, func=FUNC, schedule_type=Schedule.MINUTES, minutes=3)  # a second worker's
    Schedule.objects.filter(pk=first.pk).update(minutes=9, func="old.path")
    assert periodic.ensure_schedule(NAME, FUNC, 2).pk == first.pk
    assert _rows() == [(FUNC, 2, Schedule.MINUTES)]
    assert periodic.ensure_schedule(NAME, FUNC, 0) is None
    assert _rows() == []


def _start(name, *, fail_at=(), **kwargs):
    """Start a daemon whose work records each call and fails at the given ones."""
    calls = []

    def work():
        calls.append(len(calls) + 1)
        if len(calls) in fail_at:
            raise RuntimeError("a database hiccup")

    return periodic.start_daemon(name, work, lambda: 0.01, **kwargs), calls


def test_the_daemon_keeps_working_after_failures_and_runs_setup_once():
    setups = []
    thread, calls = _start("test-daemon-a", fail_at=(1, 2), setup=lambda: setups.append(1))
    try:
        assert periodic.start_daemon("test-daemon-a", lambda: None, lambda: 1) is thread  # one per name
        wait_until(lambda: len(calls) >= 4, 10, "four rounds")
    finally:
        periodic.stop_daemon("test-daemon-a")
    assert calls[:4] == [1, 2, 3, 4] and setups == [1] and not thread.is_alive()


def test_a_failing_setup_does_not_stop_the_daemon():
    def setup():
        raise RuntimeError("no database yet")

    thread, calls = _start("test-daemon-b", setup=setup, wait_first=True)
    try:
        wait_until(lambda: len(calls) >= 2, 10, "two rounds")
    finally:
        periodic.stop_daemon("test-daemon-b")
    assert not thread.is_alive()
