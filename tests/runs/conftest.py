"""Fixtures for batch runs: a simulated host, images that provide platforms, jobs run here."""

import pytest

from drivers.sim.models import SimExecProfile
from provisioning import services as vms
from tests.jobs.conftest import SyncJobs


@pytest.fixture
def sync_jobs(monkeypatch):
    return SyncJobs(monkeypatch)


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
def sim_host(make_host):
    return make_host("sim-1", driver="sim", cpus=8, memory_mib=8192, disk_gib=200)


@pytest.fixture
def image(db):
    image = vms.create_image(
        actor="test",
        name="debian-12",
        os="Debian 12",
        min_memory_mib=256,
        default_vcpus=2,
        default_memory_mib=1024,
        default_disk_gib=10,
    )
    vms.add_variant(
        image,
        actor="test",
        hypervisor_type="sim",
        format="sim",
        location="sim://library/debian-12",
        checksum="",
        size_gib=2,
    )
    return image


@pytest.fixture
def profile(image):
    def make(**fields):
        row, _ = SimExecProfile.objects.update_or_create(image=image.name, defaults=fields)
        return row

    return make
