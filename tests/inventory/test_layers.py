"""Inventory sits below provisioning: it reaches hypervisors only through the lazy driver registry.

(Provisioning plugs into inventory through ``inventory.services.IN_USE_CHECKERS``, never the
other way round.)
"""

import ast
from pathlib import Path

import inventory

ALLOWED = {"provisioning.drivers.registry", "provisioning.drivers.base"}


def imported_modules(path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_inventory_imports_only_the_driver_registry_from_provisioning():
    root = Path(inventory.__file__).parent
    found = {
        f"{path.relative_to(root)}: {name}"
        for path in root.rglob("*.py")
        for name in imported_modules(path)
        if name.split(".")[0] == "provisioning" and not any(name == a or name.startswith(f"{a}.") for a in ALLOWED)
    }
    assert not found
