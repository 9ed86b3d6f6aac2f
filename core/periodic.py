"""Periodic work: django-q2 Schedules that must exist, and daemon threads in worker processes.

``ensure_schedule(name, func, minutes)`` makes the Schedule ``name`` run ``func`` every
``minutes`` (0 or less: no Schedule); idempotent, so every worker may call it when it starts,
and the duplicates two workers starting at once may create are removed.

``start_daemon(name, work, interval)`` runs ``work()`` every ``interval()`` seconds (±20 %
jitter, so the threads of many workers spread out) in one daemon thread per process and
name. A failure is logged and the loop goes on: a database hiccup must not stop it for good.
``stop_daemon(name)`` ends it (tests).
"""

import logging
import random
import threading

from django.db import close_old_connections, connection

log = logging.getLogger(__name__)
ERROR_PAUSE = 5.0  # seconds after a failure when no interval could be read yet
_threads = {}
_threads_lock = threading.Lock()


def ensure_schedule(name, func, minutes):
    """The Schedule ``name`` running ``func`` every ``minutes`` (None when minutes <= 0: removed)."""
    from django_q.models import Schedule

    rows = list(Schedule.objects.filter(name=name).order_by("pk"))
    if minutes <= 0:
        Schedule.objects.filter(pk__in=[row.pk for row in rows]).delete()
        return None
    if not rows:
        return Schedule.objects.create(
            name=name, func=func, schedule_type=Schedule.MINUTES, minutes=minutes, repeats=-1
        )
    first = rows[0]
    if (first.minutes, first.func, first.schedule_type) != (minutes, func, Schedule.MINUTES):
        Schedule.objects.filter(pk=first.pk).update(minutes=minutes, func=func, schedule_type=Schedule.MINUTES)
    Schedule.objects.filter(pk__in=[row.pk for row in rows[1:]]).delete()
    return first


def start_daemon(name, work, interval, *, setup=None, wait_first=False):
    """Start the thread ``name`` (unless it runs already) calling ``work()`` every ``interval()`` s.

    ``setup()`` runs once in the thread first (a failure is logged); with ``wait_first`` the
    first ``work()`` comes after one interval instead of at once. Returns the thread.
    """
    with _threads_lock:
        running = _threads.get(name)
        if running is not None and running[0].is_alive():
            return running[0]
        stop = threading.Event()
        thread = threading.Thread(
            target=_loop, args=(name, work, interval, setup, wait_first, stop), name=name, daemon=True
        )
        _threads[name] = (thread, stop)
        thread.start()
    return thread


def stop_daemon(name, timeout=10):
    """Stop the thread ``name`` after its current round (workers never do; tests do)."""
    with _threads_lock:
        thread, stop = _threads.pop(name, (None, None))
    if thread is not None:
        stop.set()
        thread.join(timeout)


def _loop(name, work, interval, setup, wait_first, stop):
    if setup is not None:
        try:
            setup()
        except Exception:
            log.exception("%s: setup failed", name)
    seconds, skip = ERROR_PAUSE, wait_first
    while not stop.is_set():
        try:
            close_old_connections()
            seconds = interval()
            if not skip:
                work()
        except Exception:  # keep going; the next round may work (the last interval read is kept)
            log.exception("%s failed", name)
            connection.close()
        skip = False
        stop.wait(seconds * random.uniform(0.8, 1.2))  # noqa: S311 (jitter, not security)
