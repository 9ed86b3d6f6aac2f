"""``manage.py kvm_demo``: the demo with a real VM — this machine's private libvirtd (started
here, or joined if the tests or a bench run it already; ``tools/localkvm.py``) and the test
guest image (``tools/guest-image/build.py``) registered as the host ``kvm-local`` and the image
``debian-guest``; then ``serve`` until Ctrl-C, and the daemon is stopped by PID when its last
user leaves. Idempotent: a second run updates the host and the image instead of adding more.

Needs root (a system-mode libvirtd) and no other libvirtd on the machine. Guests run under
software emulation (``domain_type`` qemu; ``--kvm`` for hardware virtualisation) with QEMU
user-mode networking: each guest's SSH port is forwarded from a free port on 127.0.0.1 and
nothing else goes in or out.
"""

import contextlib
import os

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

HOST = "kvm-local"
IMAGE = "debian-guest"
POOL = "vclmgr-demo"


class Command(BaseCommand):
    help = "Start (or join) a private libvirtd, register it and the test guest image, then serve."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--kvm", action="store_true", help="domain_type kvm (hardware virtualisation)")
        parser.add_argument("--no-serve", action="store_true", help="register only, then stop the daemon again")

    def handle(self, *args, host, port, kvm, no_serve, **options):
        from tools import localkvm

        try:
            image = localkvm.guest_image()
            daemon = localkvm.Libvirtd.acquire()
        except (localkvm.RealVMError, OSError) as exc:
            raise CommandError(f"{exc}\n(make run-kvm needs root and the Debian packages of make install-dev)") from exc
        try:
            pool = ensure_pool(daemon.uri, localkvm.STATE)
            with transaction.atomic():
                register(daemon.uri, pool, image, "kvm" if kvm else "qemu", self.stdout)
            if not no_serve:
                call_command("serve", host=host, port=port)
        finally:
            daemon.release(also=("vcl-",))


def ensure_pool(uri, state):
    """A directory pool for the demo's images, disks and seeds (transient: made at each start
    over the same directory, so what it holds survives a restart)."""
    import libvirt

    path = state / "demo-pool"
    path.mkdir(parents=True, exist_ok=True)
    for p in (state, path):
        p.chmod(0o755)  # qemu runs as libvirt-qemu and must reach the files
    conn = libvirt.open(uri)
    try:
        with contextlib.suppress(libvirt.libvirtError):
            conn.storagePoolLookupByName(POOL)
            return POOL
        xml = f"<pool type='dir'><name>{POOL}</name><target><path>{path}</path></target></pool>"
        conn.storagePoolCreateXML(xml, 0)
        return POOL
    finally:
        conn.close()


def register(uri, pool, image, domain_type, out):
    from inventory import services as inventory
    from inventory.models import Hypervisor
    from provisioning import services as vms
    from provisioning.models import Image

    options = {"domain_type": domain_type, "pool": pool, "network": "user", "name": HOST}
    fields = dict(
        address="127.0.0.1",
        driver="libvirt",
        uri=uri,
        cpus=os.cpu_count() or 2,
        memory_mib=4096,
        disk_gib=20,
        cpu_ratio=4,
        driver_options=options,
    )
    found = Hypervisor.objects.filter(name=HOST).first()
    if found is None:
        inventory.create_hypervisor(actor="kvm_demo", name=HOST, reason="make run-kvm", **fields)
    else:
        inventory.update_hypervisor(found, actor="kvm_demo", reason="make run-kvm", **fields)
    location = str(image["dir"] / "disk.qcow2")
    guest = Image.objects.filter(name=IMAGE).first()
    if guest is None:
        guest = vms.create_image(
            actor="kvm_demo",
            name=IMAGE,
            os="Debian 12 (test guest)",
            min_memory_mib=128,
            default_memory_mib=256,
            min_disk_gib=0,
            default_disk_gib=1,
            description="vclmgr's test guest: busybox, dropbear, qemu-ga",
        )
    variant = guest.variants.production().filter(hypervisor_type="kvm").first()
    if variant is not None and variant.location != location:  # the guest image was rebuilt
        vms.delete_variant(variant, actor="kvm_demo", reason="the guest image was rebuilt")
        variant = None
    if variant is None:
        vms.add_variant(guest, actor="kvm_demo", hypervisor_type="kvm", format="qcow2", location=location)
    out.write(f"Real VMs: host {HOST} ({uri}, pool {pool}, {domain_type}), image {IMAGE} ({location})")
