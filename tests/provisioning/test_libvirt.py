"""The lifecycle against libvirt's own test driver, jobs run in this process (test:/// state is per process)."""

import hashlib
import shutil
from contextlib import contextmanager

import pytest

from capacity.models import Allocation
from drivers import registry as drivers
from jobs.models import Job
from provisioning import services
from provisioning.models import VM
from tests.drivers.conftest import LIBVIRT_NODES, require_libvirt


@contextmanager
def on_the_test_driver(make_host, tmp_path, node_file, name, **fields):
    """A libvirt host on the test driver, its node described by ``node_file`` (copied: the
    test driver keeps a file's state per URI)."""
    require_libvirt()
    from drivers.libvirt.connection import connections

    node = tmp_path / node_file.name
    shutil.copy(node_file, node)
    uri = f"test://{node}"
    try:
        yield make_host(name, driver="libvirt", uri=uri, **fields)
    finally:
        connections.forget(uri)


def checksummed_image(tmp_path, name, content):
    """An image of one KVM variant: a file holding ``content``, with its checksum."""
    path = tmp_path / f"{name}.qcow2"
    path.write_bytes(content)
    image = services.create_image(
        actor="test", name=name, min_memory_mib=256, default_memory_mib=512, default_disk_gib=10
    )
    services.add_variant(
        image,
        actor="test",
        hypervisor_type="kvm",
        format="qcow2",
        location=str(path),
        checksum="sha256:" + hashlib.sha256(content).hexdigest(),
        size_gib=4,
    )
    return image


@pytest.fixture
def kvm_host(make_host, tmp_path):
    with on_the_test_driver(
        make_host, tmp_path, LIBVIRT_NODES / "kvm-small.xml", "kvm-1", cpus=8, memory_mib=16384, disk_gib=200
    ) as host:
        yield host


@pytest.fixture
def kvm_image(tmp_path):
    return checksummed_image(tmp_path, "ubuntu-24.04", b"vclmgr test qcow2\n")


def test_the_lifecycle_on_libvirt(kvm_host, kvm_image, alice, sync_jobs):
    vm, job = services.request_vm(actor=alice, owner=alice, image=kvm_image)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "success", job.error_message
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "running" and vm.address and vm.variant.format == "qcow2"
    driver = drivers.driver_for(kvm_host)
    assert driver.state(vm.key) == "running"
    for action, state in (("suspend", "suspended"), ("resume", "running"), ("stop", "stopped")):
        job = services.submit_action(VM.objects.get(pk=vm.pk), action, actor=alice)
        sync_jobs.drain()
        assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
        assert driver.state(vm.key) == state
    services.submit_action(VM.objects.get(pk=vm.pk), "destroy", actor=alice)
    sync_jobs.drain()
    assert driver.state(vm.key) == "absent"
    assert VM.objects.get(pk=vm.pk).state == "destroyed"
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_checksum_mismatch_fails_cleanly_on_libvirt(kvm_host, kvm_image, alice, sync_jobs):
    kvm_image.variants.update(checksum="sha256:" + "0" * 64)
    vm, job = services.request_vm(actor=alice, owner=alice, image=kvm_image)
    sync_jobs.drain()
    job = Job.objects.get(pk=job.pk)
    assert job.status == "error" and "checksum mismatch" in job.error_message
    assert VM.objects.get(pk=vm.pk).state == "failed"
    assert drivers.driver_for(kvm_host).state(vm.key) == "absent"
    assert not Allocation.objects.filter(released__isnull=True).exists()


def test_a_destroy_libvirt_cannot_reach_keeps_the_claim(kvm_host, kvm_image, alice, sync_jobs):
    """#13 item 6 on a real driver: the host's daemon stops answering (its URI now leads to a
    closed loopback port), so the destroy fails and the claim stays; once it answers, it goes."""
    import socket

    from inventory.models import Hypervisor

    vm, _ = services.request_vm(actor=alice, owner=alice, image=kvm_image)
    sync_jobs.drain()
    assert VM.objects.get(pk=vm.pk).state == "running"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    uri = kvm_host.uri
    Hypervisor.objects.filter(pk=kvm_host.pk).update(uri=f"qemu+tcp://127.0.0.1:{closed}/system")
    services.submit_action(VM.objects.get(pk=vm.pk), "destroy", actor=alice)
    sync_jobs.drain()
    vm = VM.objects.get(pk=vm.pk)
    assert vm.state == "error" and "destroy failed" in vm.error, vm.error
    assert vm.allocation.released is None and vm.allocation.end is None
    Hypervisor.objects.filter(pk=kvm_host.pk).update(uri=uri)
    assert drivers.driver_for(Hypervisor.objects.get(pk=kvm_host.pk)).state(vm.key) == "running"  # still there
    services.submit_action(vm, "destroy", actor=alice)
    sync_jobs.drain()
    assert VM.objects.get(pk=vm.pk).state == "destroyed"
    assert drivers.driver_for(kvm_host).state(vm.key) == "absent"
    assert not Allocation.objects.filter(released__isnull=True).exists()


def inactive_size(host, key):
    import libvirt

    from drivers.libvirt import domxml

    dom = drivers.driver_for(host).conn.lookupByName(key)
    return domxml.size_of(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)), dom.info()[3]


def test_resize_on_libvirt_changes_the_definition_a_revert_keeps_it(kvm_host, kvm_image, alice, admin_user, sync_jobs):
    from provisioning import resizing

    vm, _ = services.request_vm(actor=alice, owner=alice, image=kvm_image, vcpus=1, memory_mib=1024)
    sync_jobs.drain()
    vm = VM.objects.get(pk=vm.pk)

    job = resizing.resize(vm, actor=admin_user, vcpus=2, memory_mib=2048)
    sync_jobs.drain()

    job = Job.objects.get(pk=job.pk)
    assert job.status == "success" and job.result["applies"] == "next boot", job.error_message
    assert inactive_size(kvm_host, vm.key) == ((2, 2048), 1)  # the running domain keeps its vCPU until it boots
    for action in ("stop", "snapshot"):
        services.submit_action(
            VM.objects.get(pk=vm.pk), action, actor=admin_user, **({"name": "before"} if action == "snapshot" else {})
        )
        sync_jobs.drain()
    resizing.resize(VM.objects.get(pk=vm.pk), actor=admin_user, vcpus=3)
    sync_jobs.drain()
    assert inactive_size(kvm_host, vm.key)[0] == (3, 2048)
    job = services.submit_action(VM.objects.get(pk=vm.pk), "revert", actor=admin_user, name="before")
    sync_jobs.drain()
    assert Job.objects.get(pk=job.pk).status == "success", Job.objects.get(pk=job.pk).error_message
    assert inactive_size(kvm_host, vm.key)[0] == (3, 2048)
