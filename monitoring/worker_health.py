"""Job workers' liveness and readiness, for ``manage.py worker_check`` (supervisors, probes).

Every django-q2 worker process runs a heartbeat thread (started on ``post_spawn``) that every
``BEAT_SECONDS`` probes the database and the broker and writes the result to its own file,
``<VCLMGR_VAR_DIR>/run/<queue name>/worker-<pid>.json``. On the same machine:

* live: some worker process of this queue is alive and beat within ``STALE_SECONDS``;
* ready: live, its last beat reached the database and the broker, and every migration is
  applied (checked by the caller, with the same settings).

A beat is a file, not a row: a worker cut off from the database must still be seen alive
(and not ready), and the check must not need the database to say so.
"""

import json
import os
import time
from pathlib import Path

from django.conf import settings

from core import periodic
from core.lifeline import pid_alive
from core.private_files import private_dir, write_private

BEAT_SECONDS = 5.0
STALE_SECONDS = 20.0


def beat_dir():
    return Path(settings.VAR_DIR) / "run" / settings.Q_CLUSTER["name"]


def start(**kwargs):
    """django-q2 ``post_spawn`` receiver: one heartbeat thread per worker process."""
    return periodic.start_daemon("worker-heartbeat", beat, lambda: BEAT_SECONDS)


def _probe(fn):
    try:
        fn()
    except Exception as exc:  # recorded, not raised: a failing probe is what the beat reports
        return f"{type(exc).__name__}: {exc}"[:300]
    return "ok"


def _database():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _broker():
    from django_q.brokers import get_broker

    if not get_broker().ping():
        raise RuntimeError("broker did not answer")


def beat():
    """Probe and write this process's beat (atomically: a reader never sees half a file)."""
    from django.db import connection

    where = private_dir(beat_dir())
    try:
        record = {"pid": os.getpid(), "time": time.time(), "database": _probe(_database), "broker": _probe(_broker)}
    finally:
        if not connection.in_atomic_block:  # a beat every few seconds needs no connection of its own in between
            connection.close()
    path = where / f"worker-{os.getpid()}.json"
    partial = where / f".worker-{os.getpid()}.tmp"
    write_private(partial, json.dumps(record))
    os.replace(partial, path)
    return record


def beats(now=None):
    """The fresh beats of live worker processes of this queue on this machine, newest first."""
    now = time.time() if now is None else now
    found = []
    for path in beat_dir().glob("worker-*.json") if beat_dir().is_dir() else ():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        fresh = now - record.get("time", 0) <= STALE_SECONDS
        if fresh and pid_alive(int(record.get("pid", 0))):
            found.append(record)
        elif not fresh:  # a worker long gone (restarted, reincarnated): its file goes too
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda record: -record["time"])


def problems(ready):
    """Why the workers here are not live (or not ready); empty when they are."""
    fresh = beats()
    if not fresh:
        return [f"no worker process of queue {settings.Q_CLUSTER['name']!r} beat in the last {STALE_SECONDS:g} s"]
    if not ready:
        return []
    last = fresh[0]
    found = [f"{what}: {last[what]}" for what in ("database", "broker") if last.get(what) != "ok"]
    if not found:
        from monitoring import health

        try:
            health.migrations()
        except Exception as exc:  # reported as the reason, like the other probes
            found.append(f"migrations: {exc}")
    return found
