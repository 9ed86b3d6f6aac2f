"""/metrics' text, and the job metrics counted from job events.

A scrape sums the counters every process of this machine wrote (``core.metrics``: prometheus_client's
multiprocess mode) and adds the gauges of state (capacity, hosts, reservations, VMs, queue depth)
read from the database at scrape time by the collectors registered in ``COLLECTORS``: the
same on every process and every machine.

Jobs are counted from their ``job.status`` events (``core.events.LISTENERS``, registered by
``MonitoringConfig.ready``): the one module that moves jobs between states emits them, so nothing
in the job system calls here. Observations are made after commit: a rolled-back transition
counts nothing.
"""

from collections.abc import Callable
from datetime import datetime

from django.db import transaction
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

from core.hooks import Hook
from core.metrics import forget_dead_processes

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_DURATIONS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

JOB_WAIT = Histogram("vclmgr_job_wait_seconds", "Time from submission to a job's first start.", ["opcode"],
                     buckets=_DURATIONS)  # fmt: skip
JOB_RUN = Histogram("vclmgr_job_run_seconds", "Time from a job's start to its end.", ["opcode", "status"],
                    buckets=_DURATIONS)  # fmt: skip
JOB_FAILURES = Counter("vclmgr_job_failures_total", "Jobs that ended in error, by opcode and error kind.",
                       ["opcode", "kind"])  # fmt: skip
PROVISIONING = Histogram("vclmgr_provisioning_seconds", "vm.create run time (stage, define, boot, address).",
                         ["outcome"], buckets=_DURATIONS)  # fmt: skip

# Makers of prometheus_client collectors (``collect()`` yielding metric families), each made and
# run at every scrape: a class registers once however often ready() runs.
COLLECTORS: Hook[Callable[[], object]] = Hook("monitoring.metrics.COLLECTORS")


def render():
    """The Prometheus text of every process on this machine, plus the registered collectors."""
    forget_dead_processes()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    for make in COLLECTORS:
        registry.register(make())
    return generate_latest(registry)


# --- jobs, from their status events ----------------------------------------------------------


def _seconds(later, earlier):
    if not later or not earlier:
        return None
    return max(0.0, (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds())


def on_job_status(kind, data, topics, ids):
    status, opcode = data.get("status"), data.get("opcode") or "?"
    if status == "running" and data.get("attempt") == 1:
        wait = _seconds(data.get("started"), data.get("received"))
        if wait is not None:
            transaction.on_commit(lambda: JOB_WAIT.labels(opcode=opcode).observe(wait))
    elif status in ("success", "error", "canceled") and not data.get("awaiting_children"):
        run = _seconds(data.get("ended"), data.get("started"))
        error_kind = data.get("error_kind") or "error"
        transaction.on_commit(lambda: _job_ended(opcode, status, run, error_kind))


def _job_ended(opcode, status, run, error_kind):
    if run is not None:
        JOB_RUN.labels(opcode=opcode, status=status).observe(run)
        if opcode == "vm.create" and status != "canceled":
            PROVISIONING.labels(outcome=status).observe(run)
    if status == "error":
        JOB_FAILURES.labels(opcode=opcode, kind=error_kind).inc()
