"""Fixtures for the VM app: simulated hosts in the inventory, an image, jobs run in-process."""

import pytest

from inventory.models import Hypervisor
from tests import images
from tests.jobs.conftest import SyncJobs, start_workers, sync_jobs  # noqa: F401 (fixtures)


@pytest.fixture
def make_host(db):
    def make(name, driver="sim", cpus=16, memory_mib=65536, disk_gib=1000, **fields):
        return Hypervisor.objects.create(
            name=name,
            address=f"{name}.example.org",
            driver=driver,
            cpus=cpus,
            memory_mib=memory_mib,
            disk_gib=disk_gib,
            **fields,
        )

    return make


@pytest.fixture
def sim_host(make_host):
    return make_host("sim-1")


def sim_image(name, os):
    """An image with one simulated variant, sized like a small Linux (or Windows) guest."""
    return images.sim_image(name, os=os, min_memory_mib=256, default_memory_mib=512, default_disk_gib=5)


@pytest.fixture
def image(db):
    return sim_image("debian-12", "Debian 12")


@pytest.fixture
def built():
    """``built(make_host, image, owner, **sizes)``: `plan_helpers.build_cluster` with its jobs
    run in this process (fast), before a test starts real workers."""
    from tests.provisioning.plan_helpers import build_cluster

    def make(*args, **kwargs):
        with pytest.MonkeyPatch.context() as patch:
            return build_cluster(*args, sync_jobs=SyncJobs(patch), **kwargs)

    return make
