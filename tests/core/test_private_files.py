"""var/ holds the SECRET_KEY and the SQLite database with its session keys: only the owner may
read them, whatever the umask."""

import json
import os
import stat
import subprocess
import sys

from tests.processes import ROOT


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def _start(var, code, **kwargs):
    """``python -c code`` on the product's settings with ``var`` as var/ (SQLite there, no
    Redis), outside any xdist worker's naming; it must succeed."""
    env = {
        **os.environ,
        "VCLMGR_VAR_DIR": str(var),
        "DATABASE_URL": "",
        "REDIS_URL": "",
        "DEBUG": "1",
        "DJANGO_SETTINGS_MODULE": "vclmgr.settings",
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=120, **kwargs)


def test_var_and_the_files_vclmgr_creates_there_are_the_owners_alone(tmp_path):
    var = tmp_path / "var"
    code = (
        "import os; os.umask(0o022)\n"
        "import django; django.setup()\n"
        "from django.core.cache import cache; cache.set('k', 'v')\n"
        "from django.db import connection\n"
        "with connection.cursor() as c: c.execute('CREATE TABLE t (x int)'); c.execute('INSERT INTO t VALUES (1)')\n"
        "import json, pathlib, stat\n"  # while the connection is open, its -wal and -shm exist
        "var = pathlib.Path(os.environ['VCLMGR_VAR_DIR'])\n"
        "print(json.dumps({str(p.relative_to(var)): stat.S_IMODE(p.stat().st_mode) for p in var.rglob('*')}))\n"
    )
    out = _start(var, code, capture_output=True, text=True).stdout
    modes = json.loads(out.strip().splitlines()[-1])

    assert _mode(var) == 0o700
    assert {"secret_key", "vclmgr.sqlite3", "vclmgr.sqlite3-wal", "vclmgr.sqlite3-shm"} <= set(modes)
    # prometheus_client makes its counter files with the umask's bits: their 0700 folder guards them.
    modes = {name: mode for name, mode in modes.items() if not name.startswith("metrics") or name == "metrics"}
    assert modes == {name: (0o700 if (var / name).is_dir() else 0o600) for name in modes}


def test_an_existing_world_readable_database_is_tightened(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    database = var / "vclmgr.sqlite3"
    database.touch(mode=0o644)
    os.chmod(var, 0o755)
    os.chmod(database, 0o644)
    code = "import django; django.setup()\nfrom django.db import connection; connection.ensure_connection()\n"
    _start(var, code)

    assert (_mode(var), _mode(database)) == (0o700, 0o600)
