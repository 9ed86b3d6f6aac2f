"""Fixtures for the job system: synchronous draining, and real worker clusters."""

import signal
import time

import pytest
from django.db import connection

from jobs import dispatcher, runner, wake
from tests import processes


class SyncJobs:
    """Runs jobs in this process: what a worker does, without django-q2 in between."""

    def __init__(self, monkeypatch):
        self.kicks = 0
        self.handoffs = []
        monkeypatch.setattr(wake, "kick", self._kick)
        monkeypatch.setattr(wake, "continue_job", lambda job_id, token: self.handoffs.append((job_id, token)))
        # This process is the only worker, and the jobs live in the test's transaction, which the
        # heartbeat thread's own connection cannot see on PostgreSQL: a step longer than lease/3
        # would read as a lost lease. Renewals in the job's own thread (Lease.check) still run.
        monkeypatch.setattr(runner.Heartbeat, "_due", classmethod(lambda cls: []))

    def _kick(self, n=1):
        self.kicks += n

    def run_one(self, budget=60):
        claim = dispatcher.claim_next()
        if claim is None:
            return None
        return claim.id, runner.execute(claim.id, claim.token, time.monotonic() + budget)

    def drain(self, limit=500, budget=60):
        """Run every startable job (and hand-offs) until nothing is left; returns [(id, outcome)]."""
        ran = []
        for _ in range(limit):
            if self.handoffs:
                job_id, token = self.handoffs.pop(0)
                ran.append((job_id, runner.execute(job_id, token, time.monotonic() + budget)))
                continue
            step = self.run_one(budget)
            if step is None:
                break
            ran.append(step)
        return ran


@pytest.fixture
def sync_jobs(monkeypatch):
    return SyncJobs(monkeypatch)


@pytest.fixture
def start_workers(transactional_db, tmp_path):
    """``start_workers(n, **env)`` → a real qcluster with n worker processes (stopped after the test)."""
    started = []

    def start(workers=4, **env):
        child = processes.start_worker(tmp_path, workers=workers, **env)
        started.append(child)
        return child

    yield start
    for child in started:
        # SIGKILL: a graceful django-q2 stop of the whole process group hangs until
        # Child.stop's 10 s timeout; nothing here needs a graceful stop.
        child.stop(sig=signal.SIGKILL)
    if started:
        _wait_for_other_sessions_to_end()


def _wait_for_other_sessions_to_end(timeout=5):
    """PostgreSQL: the killed workers' sessions (persistent connections) end a moment after
    them; dropping the test database at the end of the run fails while one is left."""
    if connection.vendor != "postgresql":
        return
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0] == 0:
                return
            time.sleep(0.05)
