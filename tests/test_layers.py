"""The folder tree is the architecture: each layer imports only the layers below it.

Read from the source with ``ast`` (also imports inside functions), so a lazy import cannot
hide a wrong direction; a model named to ``apps.get_model`` and a command named to
``call_command`` count as imports of the app that provides them. ARCHITECTURE.md draws the
same table.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Layer -> the layers it may import (besides itself), bottom up as the folders are.
BELOW = {"core", "accounts"}  # the shared machinery, then sign-in, roles and tokens
UP_TO_PROVISIONING = BELOW | {"placement", "jobs", "drivers", "inventory", "capacity", "provisioning"}
ALLOWED = {
    # The pure placement core: no Django, no I/O, nothing of ours.
    "placement": set(),
    # The shared machinery (events, change log, API conventions, periodic work …): Django and libraries only.
    "core": set(),
    # Sign-in, roles, API tokens, single sign-on: the core learns of them by registration.
    "accounts": {"core"},
    "drivers": BELOW,
    "jobs": BELOW,
    "inventory": BELOW | {"drivers.registry"},
    "capacity": BELOW | {"placement", "jobs", "inventory"},
    # The one app that turns requests into running VMs (images, VMs, their opcodes).
    "provisioning": BELOW | {"placement", "jobs", "drivers", "inventory", "capacity"},
    # The web console: tickets and websocket bridges to a VM's console through its host's driver.
    "console": BELOW | {"drivers", "jobs", "inventory", "provisioning"},
    # Environment templates: several connected VMs reserved as one (a gang of placement).
    "environments": UP_TO_PROVISIONING,
    # The console is below: idle reclamation reads its sessions as connection tracking.
    "reservations": UP_TO_PROVISIONING | {"console", "environments"},
    # Batch runs: beside reservations (a run holds a VM as a reservation does), below notifications.
    "runs": UP_TO_PROVISIONING | {"environments"},
    # Courses: a course group's page, its classes with a term (seats are reservations).
    "classes": UP_TO_PROVISIONING | {"console", "environments", "reservations"},
    # LTI 1.3: courses launched from an LMS land on classes' course page.
    "lti": UP_TO_PROVISIONING | {"console", "environments", "reservations", "classes"},
    # Above every app: what follows from events (mail, webhooks) and what /metrics reads.
    "notifications": UP_TO_PROVISIONING | {"console", "environments", "reservations", "runs", "classes"},
    # /metrics, /healthz, the dashboard, worker heartbeats.
    "monitoring": UP_TO_PROVISIONING | {"console", "environments", "reservations", "runs", "classes", "notifications"},
    # Ganeti's RAPI: every layer's rows as Ganeti's, beside monitoring.
    "rapi": UP_TO_PROVISIONING | {"console", "environments", "reservations", "runs", "classes", "notifications"},
}
# The project's wiring sits above every app: it may import anything.
SITE = (
    "vclmgr.urls",
    "vclmgr.routing",
    "vclmgr.asgi",
    "vclmgr.settings",
    "vclmgr.views",
    "vclmgr.demo",
    "vclmgr.management",
    "vclmgr.apps",
)
LAYERS = sorted(ALLOWED, key=len, reverse=True)


def layer_of(module):
    if module == "vclmgr" or module.startswith(SITE):
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
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name == "get_model" and isinstance(node.args[0].value, str):
                yield _model_module(node.args[0].value)
            elif name == "call_command" and isinstance(node.args[0].value, str):
                yield _command_module(node.args[0].value)


def _model_module(label):
    """``apps.get_model("vms", "VM")`` or ``("vms.VM")`` → the module of the app labelled ``vms``."""
    from django.apps import apps

    label = label.split(".")[0]
    return f"{apps.get_app_config(label).name}.models" if label in apps.app_configs else label


def _command_module(command):
    from django.core.management import get_commands

    return f"{get_commands().get(command, 'django.core')}.management.commands.{command}"


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


# Calls that change a list, dict or set in place: ``inventory.IN_USE_CHECKERS.append(...)``.
MUTATORS = {"append", "extend", "insert", "remove", "pop", "clear", "add", "discard", "update", "setdefault"}


def _is_module(dotted):
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _aliases(tree):
    """Local name -> what it is bound to, for every import in the module (functions' too)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):  # ``import a.b`` binds ``a``; ``import a.b as c`` binds a.b
            bound.update((a.asname, a.name) if a.asname else (a.name.split(".")[0],) * 2 for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            bound.update((a.asname or a.name, f"{node.module}.{a.name}") for a in node.names)
    return bound


def _module_name(node, bound):
    """``mod.NAME`` (``mod`` an imported module) or ``NAME`` imported from one -> ``mod.NAME``;
    None for anything else (a module itself, an attribute of a class or of another object)."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.insert(0, node.attr)
        node = node.value
    if not (isinstance(node, ast.Name) and node.id in bound):
        return None
    dotted = ".".join([bound[node.id], *attrs])
    return dotted if _is_module(dotted.rpartition(".")[0]) and not _is_module(dotted) else None


def written_names(path):
    """Module-level names of other modules that this module rebinds, item-assigns or mutates."""
    tree = ast.parse(path.read_text(), str(path))
    bound = _aliases(tree)
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        for target in targets:
            # ``NAME = …`` after ``from mod import NAME`` only rebinds the local name.
            local = isinstance(target, ast.Name) and isinstance(node, ast.Assign | ast.AnnAssign | ast.Delete)
            while isinstance(target, ast.Subscript):  # ``mod.NAME[key] = …`` writes into mod.NAME
                target, local = target.value, False
            if not local and (name := _module_name(target, bound)):
                yield name


def foreign_writes():
    for module, path in project_modules():
        source = layer_of(module)
        for name in written_names(path):
            if layer_of(name) not in (None, source):
                yield f"{module} writes {name} (a layer is extended through its hooks: core.hooks)"


def test_every_module_belongs_to_a_layer():
    folders = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    strays = [m for m, _ in project_modules() if m.split(".")[0] in folders and layer_of(m) is None]
    assert strays == []


def test_layers_import_only_downwards():
    assert sorted(set(wrong_directions())) == []


def test_no_app_writes_into_another_apps_module():
    # A layer is extended through the hooks it declares, registered in AppConfig.ready():
    # never by appending to, item-assigning into or rebinding a name of another app's module.
    assert sorted(set(foreign_writes())) == []


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("placement.engine", "placement"),
        ("provisioning.opcodes.lifecycle", "provisioning"),
        ("drivers.registry", "drivers"),
        ("vclmgr.urls", "site"),
        ("tests.fake.x", None),
    ],
)
def test_layer_of_knows_the_tree(module, layer):
    # The checker itself: each folder is its layer; the site's wiring above all; tests in none.
    assert layer_of(module) == layer


def test_the_checker_sees_a_wrong_direction(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from reservations import services\n")
    assert "reservations.services" in set(imports_of(bad))
    assert "reservations" not in ALLOWED["placement"]


def test_the_checker_sees_models_and_commands_named_across_layers(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from django.apps import apps\n"
        "from django.core.management import call_command\n"
        "def f():\n"
        "    apps.get_model('vms', 'VM')\n"
        "    apps.get_model('reservations.Reservation')\n"
        "    call_command('plan', 'list')\n"
        "    call_command('migrate')\n"
    )
    named = set(imports_of(bad))
    assert {"provisioning.models", "reservations.models", "provisioning.management.commands.plan"} <= named
    assert layer_of("django.core.management.commands.migrate") is None  # Django's own: no layer


def test_the_checker_sees_a_write_into_another_module(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from inventory import services as inventory\n"
        "from inventory.services import CLAIMS_END, ON_STATE_CHANGE\n"
        "import jobs.opcodes\n"
        "def ready(f):\n"
        "    inventory.IN_USE_CHECKERS.append(f)\n"
        "    jobs.opcodes.VERIFY_CHECKS['x'] = f\n"
        "    CLAIMS_END[:] = [f]\n"
        "    inventory.IN_USE_CHECKERS.register(f)  # a hook: fine\n"
        "    inventory.update_hypervisor(f, actor=f)  # a function of the module, not a write\n"
        "    ON_STATE_CHANGE = [f]  # a local name\n"
    )
    assert set(written_names(bad)) == {
        "inventory.services.IN_USE_CHECKERS",
        "inventory.services.CLAIMS_END",
        "jobs.opcodes.VERIFY_CHECKS",
    }
