"""Demo inventory: blade center bc1 with 16 simulated hypervisors, registered through the
same service as the admin form and the API. Running it again changes nothing."""

from core.changelog import Actor
from inventory import services
from inventory.models import BladeCenter, NodeGroup

DEMO = Actor(name="demo")


def blade_center(stdout):
    if not NodeGroup.objects.filter(name="lab").exists():
        services.create_node_group(actor=DEMO, name="lab", description="Demo lab hosts")
    if BladeCenter.objects.filter(name="bc1").exists():
        stdout.write("  blade center bc1: already there")
        return
    registration = services.register_blade_center(
        {
            "name": "bc1",
            "site": "demo room",
            "model": "simulated 16-slot chassis",
            "slot_count": 16,
            "hostname_pattern": "{chassis}-s{slot:02d}",
            "first_address": "192.0.2.11",
            "driver": "sim",
            "uri_template": "sim://{name}",
            "group": "lab",
            "cpus": 32,
            "memory_mib": 131072,
            "disk_gib": 2000,
            "tags": ["demo"],
        },
        actor=DEMO,
    )
    if not registration.report.committed:
        raise RuntimeError("demo blade center refused: " + "; ".join(registration.report.messages()))
    stdout.write(f"  blade center bc1: {len(registration.hosts)} simulated hypervisors (bc1-s01 … bc1-s16)")
