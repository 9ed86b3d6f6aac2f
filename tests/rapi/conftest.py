"""The RAPI tests' fixtures: jobs run in this process (as in the jobs app's tests)."""

import pytest

from tests.jobs.conftest import SyncJobs


@pytest.fixture
def sync_jobs(monkeypatch):
    return SyncJobs(monkeypatch)
