"""Prometheus counters counted in any process, and the bookkeeping of their files.

Counters and histograms (placement refusals, deliveries) and the websocket gauge are counted in
the process where things happen, in prometheus_client's multiprocess mode: each process writes
its own files under ``PROMETHEUS_MULTIPROC_DIR`` (settings put it under var/ and export it before
this module is imported) and a scrape (``monitoring.metrics``) sums every file of the machine.
Files of processes that ended keep their counts (totals stay monotonic); their share of the
websocket gauge (``livesum``) goes when they end.

The directory's bookkeeping, as prometheus_client asks (``mark_process_dead``, a directory
wiped before startup): a process that ends forgets its live gauges and the files in which it
counted nothing (``forget``: at exit in every process; ``serve`` for each child it sees end, and
for every process gone when it stops; django-q2 for each worker it replaces). ``serve`` clears
the directory when it starts (``claim_directory``), keeping only the files of processes of
another ``serve`` on this machine that shares it. A process never takes over a live gauge file
of an ended process whose pid it was given (checked at start and after each fork): a pid used
again must not count the dead process's websockets again.
"""

import atexit
import fcntl
import os
import re
from pathlib import Path

from prometheus_client import Counter, Gauge, multiprocess
from prometheus_client.mmap_dict import MmapedDict

from core.lifeline import pid_alive

_PID_FILE = re.compile(r"^\w+?_(\d+)\.db$")


def _folder():
    return Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])


def _files(folder):
    """``(pid, path)`` of every per-process file in ``folder``."""
    for path in folder.glob("*.db"):
        match = _PID_FILE.match(path.name)
        if match:
            yield int(match.group(1)), path


def _drop_live_files(pid):
    multiprocess.mark_process_dead(pid, str(_folder()))


def _counted_nothing(path):
    try:
        return all(value == 0 for _key, value, _ts, _pos in MmapedDict.read_all_values_from_file(str(path)))
    except (OSError, ValueError):
        return False


def forget(pid):
    """Process ``pid`` has ended: its live gauges go (prometheus_client's ``mark_process_dead``),
    and so do its files that hold nothing but zeros (a health check, a management command), which
    would only pile up; files with counts stay until ``serve`` starts again (totals never drop)."""
    _drop_live_files(pid)
    for owner, path in _files(_folder()):
        if owner == pid and _counted_nothing(path):
            path.unlink(missing_ok=True)


def forget_dead_processes():
    """Drop the live gauges of processes that are gone, whoever saw them end or not (a killed web
    process would count forever). Cheap enough for every scrape: no file is read."""
    for pid, path in _files(_folder()):
        if path.name.startswith("gauge_live") and not pid_alive(pid):
            _drop_live_files(pid)


def claim_directory():
    """At ``serve``'s start: clear the directory of earlier runs' files. Another ``serve`` of this
    machine may share it (the web and worker units of one host): then only the files of processes
    that are gone are removed. Returns the open lock file that says a ``serve`` runs here; it is
    held (shared) as long as the caller lives, and not inherited by its children."""
    folder = _folder()
    with open(folder / ".serve-start.lock", "a") as starting:
        fcntl.flock(starting, fcntl.LOCK_EX)  # one start at a time: the test below stays true
        running = open(folder / ".serve-running.lock", "a")  # noqa: SIM115 (held by the caller)
        try:
            fcntl.flock(running, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        for pid, path in _files(folder):
            # alone: any pid but ours is an earlier run's (a pid alive now may be another process's).
            if pid != os.getpid() and (alone or not pid_alive(pid)):
                path.unlink(missing_ok=True)
        fcntl.flock(running, fcntl.LOCK_SH)
    return running


def _fresh_live_files():
    # A live gauge file under this pid is a dead process's: taking it over would count its
    # websockets again. Runs before this process's first gauge value, and in each forked child.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _drop_live_files(os.getpid())


def _at_exit():
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        forget(os.getpid())


_fresh_live_files()
os.register_at_fork(after_in_child=_fresh_live_files)
atexit.register(_at_exit)


REFUSED = Counter("vclmgr_placement_refused_total", "Claims refused for lack of a host.")
REFUSALS = Counter("vclmgr_placement_refusals_total",
                   "Refused claims by reason (a claim counts once under each reason that rejected a host).",
                   ["reason"])  # fmt: skip
DELIVERIES = Counter("vclmgr_deliveries_total", "Mail and webhook delivery tries by outcome.",
                     ["channel", "outcome"])  # fmt: skip
WS_CLIENTS = Gauge("vclmgr_websocket_clients", "Websocket clients connected.", multiprocess_mode="livesum")


def placement_refused(reasons):
    """A claim found no host; ``reasons`` counts rejected hosts per reason code."""
    REFUSED.inc()
    for reason, hosts in (reasons or {}).items():
        if hosts:
            REFUSALS.labels(reason=reason).inc()
