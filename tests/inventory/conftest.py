"""Inventory fixtures: hosts, chassis, groups and credentials made through the services,
and helpers to write import files."""

import csv
import io

import pytest

from core.changelog import Actor
from inventory import services
from inventory.models import Hypervisor
from inventory.resources import COLUMNS

TEST = Actor(name="test")


def host_row(i, **overrides):
    """A full import row (as a dict of the export columns, without id)."""
    row = {
        "name": f"h{i:05d}",
        "address": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
        "driver": "libvirt",
        "uri": f"qemu+ssh://root@10.0.0.{i % 250 + 1}/system",
        "credential": "",
        "blade_center": "",
        "slot": "",
        "group": "",
        "cpus": 32,
        "memory_mib": 131072,
        "disk_gib": 2000,
        "cpu_ratio": 4.0,
        "memory_ratio": 1.0,
        "disk_ratio": 1.0,
        "reserved_cpus": 0,
        "reserved_memory_mib": 0,
        "reserved_disk_gib": 0,
        "max_vms": "",
        "spindles": 1,
        "overlay": "",
        "state": "online",
        "state_reason": "",
        "tags": "",
        "bmc_address": "",
        "bmc_credential": "",
        "bmc_system": "",
        "bmc_verify_tls": "true",
    }
    row.update(overrides)
    return row


def to_csv(rows, columns=None):
    columns = columns or [c for c in COLUMNS if c != "id" and any(c in r for r in rows)] or list(rows[0])
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()


def import_csv(rows, dry_run=False, columns=None, actor=TEST):
    return services.import_hypervisors(to_csv(rows, columns), "csv", actor=actor, dry_run=dry_run, file_name="test.csv")


@pytest.fixture
def hosts_count():
    return lambda: Hypervisor.objects.count()
