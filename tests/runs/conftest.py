"""Fixtures for batch runs: a simulated host, images that provide platforms, jobs run here."""

import pytest

from drivers.sim.models import SimExecProfile
from tests.images import sim_image
from tests.jobs.conftest import sync_jobs  # noqa: F401 (fixture)


@pytest.fixture(autouse=True)
def _run_settings(settings, tmp_path):
    settings.RUN_STEP_SECONDS = 5
    settings.RUN_POLL_SECONDS = 0.01
    settings.STORAGES = {
        **settings.STORAGES,
        "runs": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "runs")},
        },
    }


@pytest.fixture
def image(db):
    return sim_image(
        "debian-12", os="Debian 12", min_memory_mib=256, default_vcpus=2, default_memory_mib=1024, default_disk_gib=10
    )


@pytest.fixture
def profile(image):
    def make(**fields):
        row, _ = SimExecProfile.objects.update_or_create(image=image.name, defaults=fields)
        return row

    return make
