"""Discovery of a libvirt host with GPUs (libvirt's test driver, a node file holding PCI
devices): the host is registered with the GPUs and vGPU types its node devices show."""

import shutil

import pytest

from core.models import ObjectChange
from inventory.discovery import services
from inventory.models import Hypervisor
from tests.drivers.conftest import require_libvirt
from tests.drivers.test_libvirt_gpus import A100, GPU_HOST

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu_uri(tmp_path):
    require_libvirt()
    from drivers.libvirt.connection import connections

    node = tmp_path / "gpu-host.xml"
    shutil.copy(GPU_HOST, node)
    uri = f"test://{node}"
    yield uri
    connections.forget(uri)


def test_a_discovered_host_is_registered_with_its_gpus(gpu_uri):
    found = services.discover("libvirt", [gpu_uri], actor="test", commit=True)

    assert found.committed, found.report.messages()
    host = Hypervisor.objects.get(name="gpu-host")
    assert [(d["kind"], d["model"], d["count"], d["addresses"]) for d in host.devices] == [
        ("gpu", A100, 2, ["0000:17:00.0", "0000:65:00.0"]),
        ("mdev", "nvidia-t4-16q", 1, ["0000:3b:00.0"]),
        ("mdev", "nvidia-t4-1b", 16, ["0000:3b:00.0"]),
    ]
    assert ObjectChange.objects.filter(reason="devices reported by the driver").count() == 1


def test_devices_set_by_hand_are_replaced_by_what_the_host_reports(gpu_uri, make_host):
    make_host("gpu-host", driver="libvirt", uri=gpu_uri, devices=[{"kind": "gpu", "model": "nvidia-h100", "count": 8}])

    services.discover("libvirt", [gpu_uri], actor="test", commit=True)

    assert [d["model"] for d in Hypervisor.objects.get(name="gpu-host").devices] == [
        A100,
        "nvidia-t4-16q",
        "nvidia-t4-1b",
    ]
