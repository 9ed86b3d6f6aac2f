"""The folder tree is the architecture: each layer imports only the layers below it.

Read from the source with ``ast`` (also imports inside functions), so a lazy import cannot
hide a wrong direction. ARCHITECTURE.md draws the same table.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Layer -> the layers it may import (besides itself). Most specific prefixes first.
ALLOWED = {
    "provisioning.placement": set(),
    # The shared machinery (events, change log, API conventions, periodic work …): Django and libraries only.
    "core": set(),
    # Sign-in, roles, API tokens, single sign-on: the core below it learns of them by registration.
    "accounts": {"core"},
    "provisioning.drivers": {"core", "accounts"},
    "provisioning.jobs": {"core", "accounts"},
    "inventory": {"core", "accounts", "provisioning.drivers.registry"},
    "provisioning.capacity": {"core", "accounts", "provisioning.placement", "provisioning.jobs", "inventory"},
    "provisioning.vms": {
        "core", "accounts", "provisioning.placement", "provisioning.jobs", "provisioning.drivers",
        "provisioning.capacity", "inventory",
    },
    # The console is below: idle reclamation reads its sessions as connection tracking.
    "reservations": {
        "core", "accounts", "provisioning.placement", "provisioning.jobs", "provisioning.drivers",
        "provisioning.capacity", "provisioning.vms", "inventory", "console",
    },
    # Batch runs: beside reservations (a run holds a VM as a reservation does), below notifications.
    "runs": {
        "core", "accounts", "provisioning.placement", "provisioning.jobs", "provisioning.drivers",
        "provisioning.capacity", "provisioning.vms", "inventory",
    },
    # Above every app: what follows from events (mail, webhooks) and what /metrics reads.
    "notifications": {
        "core", "accounts", "provisioning.placement", "provisioning.jobs", "provisioning.drivers",
        "provisioning.capacity", "provisioning.vms", "inventory", "console", "reservations", "runs",
    },
    # /metrics, /healthz, the dashboard, worker heartbeats.
    "monitoring": {
        "core", "accounts", "provisioning.placement", "provisioning.jobs", "provisioning.drivers",
        "provisioning.capacity", "provisioning.vms", "inventory", "console", "reservations", "runs",
        "notifications",
    },
    # Ganeti's RAPI: every layer's rows as Ganeti's, beside monitoring.
    "rapi": {
        "core", "accounts", "provisioning.placement", "provisioning.jobs", "provisioning.drivers",
        "provisioning.capacity", "provisioning.vms", "inventory", "console", "reservations", "runs",
        "notifications",
    },
    # The web console: tickets and websocket bridges to a VM's console through its host's driver.
    "console": {"core", "accounts", "provisioning.drivers", "provisioning.vms", "provisioning.jobs", "inventory"},
}
# The project's wiring sits above every app: it may import anything.
SITE = ("vclmgr.urls", "vclmgr.routing", "vclmgr.asgi", "vclmgr.settings", "vclmgr.views", "vclmgr.demo",
        "vclmgr.management", "vclmgr.apps")
LAYERS = sorted(ALLOWED, key=len, reverse=True)


def layer_of(module):
    if module.startswith(SITE):
        return "site"
    for layer in LAYERS:
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def project_modules():
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in {"tests", "bench", "tools", ".venv", "var"} or "migrations" in rel.parts:
            continue
        yield ".".join(rel.with_suffix("").parts).removesuffix(".__init__"), path


def imports_of(path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from a.b import c`` may name a module or a name inside one: a.b.c covers both.
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def wrong_directions():
    for module, path in project_modules():
        source = layer_of(module)
        if source in (None, "site"):
            continue
        for imported in imports_of(path):
            target = layer_of(imported)
            if target in (None, source):
                continue
            allowed = ALLOWED[source]
            if target not in allowed and not any(imported.startswith(a) for a in allowed if "." in a):
                yield f"{module} imports {imported} ({source} may not import {target})"


def test_every_module_belongs_to_a_layer():
    apps = {"inventory", "provisioning", "reservations", "runs", "vclmgr", "core", "accounts", "notifications",
            "monitoring", "rapi", "console"}
    strays = [m for m, _ in project_modules()
              if m.split(".")[0] in apps and m not in {"provisioning", "vclmgr"} and layer_of(m) is None]
    assert strays == []


def test_layers_import_only_downwards():
    assert sorted(set(wrong_directions())) == []


@pytest.mark.parametrize("module", ["provisioning.placement.engine", "tests.fake.x"])
def test_layer_of_knows_the_tree(module):
    # The checker itself: a placement module is in the pure core; a test module in no layer.
    assert layer_of(module) == ("provisioning.placement" if module.startswith("provisioning") else None)


def test_the_checker_sees_a_wrong_direction(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from reservations import services\n")
    assert "reservations.services" in set(imports_of(bad))
    assert "reservations" not in ALLOWED["provisioning.placement"]
