"""A VM claimed with GPUs, built on libvirt's test driver: the host's GPUs come from its node
devices at refresh, the claim's ``gpu:<model>`` reaches the driver, and the domain gets them
as hostdevs (defined and started by the test driver; nothing is really passed through)."""

import xml.etree.ElementTree as ET
from datetime import timedelta

import pytest
from django.utils import timezone

from capacity import services as capacity
from capacity.models import Allocation
from drivers import registry as drivers
from jobs.models import Job
from provisioning import services
from provisioning.models import VM
from provisioning.opcodes import host_ops
from provisioning.opcodes.lifecycle import claimed_gpus
from tests.conftest import TEST
from tests.drivers.test_libvirt_gpus import A100, GPU_HOST
from tests.provisioning.test_libvirt import checksummed_image, on_the_test_driver


@pytest.fixture
def gpu_host(make_host, tmp_path, settings):
    settings.VCLMGR_ADDRESS_TIMEOUT = 10  # the test driver leases at once: a failure need not wait long
    with on_the_test_driver(
        make_host, tmp_path, GPU_HOST, "gpu-host", cpus=32, memory_mib=262144, disk_gib=200
    ) as host:
        host_ops.refresh_facts(host.pk, actor=TEST)
        host.refresh_from_db()
        yield host


@pytest.fixture
def cuda_image(tmp_path):
    return checksummed_image(tmp_path, "cuda-24.04", b"vclmgr test qcow2 with CUDA\n")


def gpu_claim(image, owner, gpus, gpu_model):
    end = timezone.now() + timedelta(hours=2)
    size = {"vcpus": 2, "memory_mib": 1024, "disk_gib": 10}
    demand = services.demand_for(
        image, size, start=timezone.now(), end=end, purpose="gpu", gpus=gpus, gpu_model=gpu_model
    )
    return capacity.claim(demand, actor="test", owner=owner), end


def test_a_refresh_records_the_hosts_gpus_from_its_node_devices(gpu_host):
    assert [(d["kind"], d["model"], d["count"]) for d in gpu_host.devices] == [
        ("gpu", A100, 2),
        ("mdev", "nvidia-t4-16q", 1),
        ("mdev", "nvidia-t4-1b", 16),
    ]


def test_a_vm_claimed_with_gpus_is_defined_with_them_and_gives_them_back(gpu_host, cuda_image, alice, sync_jobs):
    claim, end = gpu_claim(cuda_image, alice, 2, A100)
    assert claim.extras == {f"gpu:{A100}": 2}

    vm, job = services.request_vm(
        actor=alice, owner=alice, image=cuda_image, vcpus=2, memory_mib=1024, disk_gib=10, end=end, allocation=claim
    )
    sync_jobs.drain()

    job = Job.objects.get(pk=job.pk)
    assert job.status == "success", job.error_message
    driver = drivers.driver_for(gpu_host)
    domain = ET.fromstring(driver.conn.lookupByName(vm.key).XMLDesc(0))
    assert sorted(h.find("source/address").get("bus") for h in domain.findall("devices/hostdev")) == ["0x17", "0x65"]
    services.submit_action(VM.objects.get(pk=vm.pk), "destroy", actor=alice)
    sync_jobs.drain()
    assert driver.state(vm.key) == "absent"
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_vm_claimed_with_a_vgpu_gets_an_mdev(gpu_host, cuda_image, alice, sync_jobs):
    claim, end = gpu_claim(cuda_image, alice, 1, "nvidia-t4-1b")

    vm, job = services.request_vm(
        actor=alice, owner=alice, image=cuda_image, vcpus=2, memory_mib=1024, disk_gib=10, end=end, allocation=claim
    )
    sync_jobs.drain()

    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
    domain = ET.fromstring(drivers.driver_for(gpu_host).conn.lookupByName(vm.key).XMLDesc(0))
    assert [h.get("type") for h in domain.findall("devices/hostdev")] == ["mdev"]


def test_the_spec_asks_for_the_claims_gpus_only():
    assert claimed_gpus(Allocation(extras={f"gpu:{A100}": 2, "gpu:nvidia-t4-1b": 0, "licence:matlab": 1})) == {A100: 2}
    assert claimed_gpus(Allocation(extras={})) == {}
    assert claimed_gpus(None) == {}


def test_a_vms_new_claim_asks_for_the_gpus_of_its_old_one(gpu_host, cuda_image, alice):
    claim, end = gpu_claim(cuda_image, alice, 2, A100)
    vm, _job = services.request_vm(
        actor=alice, owner=alice, image=cuda_image, vcpus=2, memory_mib=1024, disk_gib=10, end=end, allocation=claim
    )

    demand = services.vm_demand(VM.objects.select_related("allocation").get(pk=vm.pk), purpose="moved")

    assert demand.extras == {f"gpu:{A100}": 2} and demand.gpus_any == 0
    assert services.claimed_gpu_ask(Allocation(extras={"gpu:nvidia-t4-1b": 1})) == {
        "gpus": 1,
        "gpu_model": "nvidia-t4-1b",
    }
    assert services.claimed_gpu_ask(Allocation(extras={})) == {}
