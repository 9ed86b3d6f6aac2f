"""``manage.py kvm_demo`` (``make run-kvm``) registers this machine's private libvirtd and the
test guest image, once however often it runs, and the host it registers really is reachable:
the libvirt driver reports its facts through the registered URI and pool."""

import pytest
from django.core.management import call_command

from drivers import registry
from drivers.libvirt.connection import connections
from inventory.models import Hypervisor
from provisioning.models import Image
from vclmgr.management.commands import kvm_demo

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_pool(libvirtd, libvirt_conn):
    yield
    import shutil

    import libvirt

    from tools.localkvm import STATE

    try:
        libvirt_conn.storagePoolLookupByName(kvm_demo.POOL).destroy()
    except libvirt.libvirtError:
        pass
    shutil.rmtree(STATE / "demo-pool", ignore_errors=True)
    connections.forget(libvirtd.uri)


def test_it_registers_the_private_libvirtd_and_the_guest_image_once(db, libvirtd, guest_image, demo_pool):
    call_command("kvm_demo", no_serve=True)
    call_command("kvm_demo", no_serve=True)

    host = Hypervisor.objects.get()
    assert (host.name, host.driver, host.uri) == ("kvm-local", "libvirt", libvirtd.uri)
    assert host.driver_options == {"domain_type": "qemu", "pool": kvm_demo.POOL, "network": "user", "name": "kvm-local"}
    image = Image.objects.get(name="debian-guest")
    assert [v.location for v in image.variants.all()] == [str(guest_image["dir"] / "disk.qcow2")]
    facts = registry.driver_for(host).facts()
    assert facts.name == "kvm-local" and facts.extra["pool"] == kvm_demo.POOL
    # the session's registration with the shared daemon outlived the command's own
    assert libvirtd.user.exists()
