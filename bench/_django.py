"""Set Django up for a benchmark in a private var/ directory: SQLite there, or a PostgreSQL URL
(flushed first), no Redis, quiet logs. Returns the database vendor."""

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def configure(postgres, prefix="vclmgr-bench-"):
    sys.path.insert(0, str(ROOT))
    var = tempfile.mkdtemp(prefix=prefix)
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "vclmgr.settings",
            "DEBUG": "1",
            "VCLMGR_VAR_DIR": var,
            "LOG_LEVEL": "WARNING",
            "REDIS_URL": "",
            "VCLMGR_SIM_OPTIONS": "{}",
            "DATABASE_URL": postgres or f"sqlite:///{var}/bench.sqlite3",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    if connection.vendor == "postgresql":
        call_command("flush", interactive=False, verbosity=0)
    return connection.vendor
