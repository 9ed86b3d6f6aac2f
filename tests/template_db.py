"""Parallel test workers copy one migrated database instead of each running every migration.

Applying vclmgr's migrations to an empty database costs 8–15 CPU-seconds; with one test
database per pytest-xdist worker that was paid by every worker of both legs. The first worker
to get here builds a template the usual way (``create_test_db``: migrate, cache table) under a
file lock; every worker, that one included, then starts from a copy of it: a file copy or an
SQLite backup (in-memory databases) on SQLite, ``CREATE DATABASE … TEMPLATE`` on PostgreSQL.
The template is made once per run (the run's id is written beside it) and removed by the run's
controller at the end (``remove_template``).
"""

import fcntl
import hashlib
import shutil
import sqlite3
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import connection, connections

ROOT = Path(__file__).resolve().parent.parent


def _var():
    path = Path(settings.VAR_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _template_name():
    if connection.vendor == "sqlite":
        return str(_var() / "test-template.sqlite3")
    # Databases on the server are shared by every checkout on this machine: one template each.
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]
    return f"test_{settings.DATABASES['default']['NAME']}_template_{checkout}"


@contextmanager
def _locked():
    with open(_var() / f"test-template-{connection.vendor}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _marker():
    return _var() / f"test-template-{connection.vendor}.run"


def _build_template(create_test_db, run_id, verbosity):
    """The template for this run, built now unless another worker built it."""
    name = _template_name()
    marker = _marker()
    if marker.exists() and marker.read_text() == run_id:
        return name
    test_settings = connection.settings_dict["TEST"]
    own_name = test_settings.get("NAME")
    test_settings["NAME"] = name
    try:
        create_test_db(verbosity=verbosity, autoclobber=True, serialize=False, keepdb=False)
    finally:
        test_settings["NAME"] = own_name
        _disconnect()
    marker.write_text(run_id)
    return name


def _disconnect():
    """Close the connection for good: a pooled one (PostgreSQL) would keep its session on the
    template, which PostgreSQL then refuses to copy, and keep pointing at it."""
    wrapper = connections[connection.alias]  # (``connection`` is a proxy)
    wrapper.close()
    if wrapper.alias in getattr(type(wrapper), "_connection_pools", {}):  # (reading .pool would open one)
        wrapper.close_pool()


def _copy(template, name):
    creation = connection.creation
    if connection.vendor == "postgresql":
        quote = connection.ops.quote_name
        with creation._nodb_cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {quote(name)}")
            cursor.execute(f"CREATE DATABASE {quote(name)} TEMPLATE {quote(template)}")
    elif not creation.is_in_memory_db(name):
        shutil.copyfile(template, name)
    connection.settings_dict["NAME"] = name
    settings.DATABASES[connection.alias]["NAME"] = name
    if connection.vendor == "sqlite" and creation.is_in_memory_db(name):
        connection.ensure_connection()
        source = sqlite3.connect(template)
        try:
            source.backup(connection.connection)
        finally:
            source.close()


def start_from_template(run_id):
    """Make the default connection's ``create_test_db`` copy this run's template."""
    creation = connection.creation
    create_test_db = creation.create_test_db

    def from_template(verbosity=1, autoclobber=False, serialize=True, keepdb=False):
        if keepdb:
            return create_test_db(verbosity=verbosity, autoclobber=autoclobber, serialize=serialize, keepdb=keepdb)
        name = creation._get_test_db_name()
        with _locked():
            template = _build_template(create_test_db, run_id, verbosity)
            # Copies made while another worker copies are fine, but PostgreSQL refuses to copy a
            # database someone is connected to: the builder's connection is closed by now.
            _copy(template, name)
        if serialize:
            connection._test_serialized_contents = creation.serialize_db_to_string()
        connection.ensure_connection()
        return name

    creation.create_test_db = from_template


def remove_template(run_id):
    """At the end of a run (its controller): drop the template its workers copied, unless a
    later run has made its own since."""
    marker = _marker()
    with _locked():
        if marker.exists() and marker.read_text() == run_id:
            _drop_template()
            marker.unlink(missing_ok=True)


def _drop_template():
    name = _template_name()
    if connection.vendor == "postgresql":
        with connection.creation._nodb_cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)}")
    else:
        Path(name).unlink(missing_ok=True)
