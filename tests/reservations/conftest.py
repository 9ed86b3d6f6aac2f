"""Fixtures for reservations: simulated hosts, an image, jobs run in this process."""

import pytest

from tests.images import sim_image
from tests.jobs.conftest import sync_jobs  # noqa: F401 (fixture)


@pytest.fixture
def image(db):
    return sim_image(
        "debian-12", os="Debian 12", min_memory_mib=256, default_vcpus=2, default_memory_mib=2048, default_disk_gib=10
    )
