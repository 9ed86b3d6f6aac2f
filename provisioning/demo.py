"""Demo images with simulated variants, and a simulated host to run them when none exists.

Idempotent: existing images (by name) are left alone.
"""

from inventory import services as inventory
from inventory.models import Hypervisor
from provisioning import services
from provisioning.models import Image

IMAGES = [
    {
        "name": "debian-12",
        "os": "Debian 12",
        "description": "Plain Debian for labs.",
        "default_memory_mib": 1024,
        "pool_size": 2,  # public: finished runs' VMs are reverted and kept for the next run
    },
    {
        "name": "ubuntu-24.04-desktop",
        "os": "Ubuntu 24.04",
        "description": "Desktop with lab tools.",
        "min_memory_mib": 2048,
        "default_memory_mib": 4096,
        "default_vcpus": 2,
        "default_disk_gib": 20,
    },
    {
        "name": "win11-secure-exam",
        "os": "Windows 11",
        "description": "Locked-down exam desktop; reverted after use.",
        "min_memory_mib": 4096,
        "default_memory_mib": 4096,
        "default_vcpus": 2,
        "default_disk_gib": 40,
        "revert_on_end": True,
    },
]


def images(stdout):
    made = 0
    for spec in IMAGES:
        if Image.objects.filter(name=spec["name"]).exists():
            continue
        image = services.create_image(actor="demo", reason="demo", **spec)
        services.add_variant(
            image,
            actor="demo",
            hypervisor_type="sim",
            format="sim",
            location=f"sim://library/{spec['name']}",
            size_gib=spec.get("default_disk_gib", 10) // 2,
        )
        made += 1
    if not Hypervisor.objects.filter(driver=Hypervisor.Driver.SIM).exists():
        inventory.create_hypervisor(
            actor="demo",
            reason="demo: a host for the demo images",
            name="sim-demo-1",
            address="sim-demo-1.local",
            driver="sim",
            cpus=32,
            memory_mib=131072,
            disk_gib=2000,
        )
    stdout.write(f"  images: {made} demo images with simulated variants ({len(IMAGES) - made} already there)")
