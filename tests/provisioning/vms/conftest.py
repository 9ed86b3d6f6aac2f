"""Fixtures for the VM app: simulated hosts in the inventory, an image, jobs run in-process."""

import pytest

from inventory.models import Hypervisor
from provisioning.vms import services
from tests.provisioning.jobs.conftest import SyncJobs


@pytest.fixture
def sync_jobs(monkeypatch):
    return SyncJobs(monkeypatch)


@pytest.fixture
def make_host(db):
    def make(name, driver="sim", cpus=16, memory_mib=65536, disk_gib=1000, **fields):
        return Hypervisor.objects.create(name=name, address=f"{name}.example.org", driver=driver, cpus=cpus,
                                         memory_mib=memory_mib, disk_gib=disk_gib, **fields)

    return make


@pytest.fixture
def sim_host(make_host):
    return make_host("sim-1")


@pytest.fixture
def image(db):
    image = services.create_image(actor="test", name="debian-12", os="Debian 12", min_memory_mib=256,
                                  default_memory_mib=512, default_disk_gib=5)
    services.add_variant(image, actor="test", hypervisor_type="sim", format="sim", location="sim://library/debian-12",
                         checksum="", size_gib=2)
    return image
