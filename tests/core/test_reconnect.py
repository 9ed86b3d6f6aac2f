"""A statement on a connection PostgreSQL dropped (``pg_terminate_backend``) is sent again on a
new one outside a transaction; inside one, the error stands. Real sessions on the machine's
PostgreSQL (both legs have it), through Django's own backend."""

import logging

import psycopg
import pytest
from django.db import OperationalError
from django.db.utils import ConnectionHandler

from core import reconnect

PG = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture
def pg(db):
    pg = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "test",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
    handler = ConnectionHandler({"default": pg, "pg": pg})
    connection = handler["pg"]
    yield connection
    connection.close()


def backend_pid(connection):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def terminate(pid):
    with psycopg.connect(PG, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]


def test_a_dropped_session_is_replaced_and_the_statement_sent_again(pg, caplog):
    first = backend_pid(pg)
    assert pg.execute_wrappers[0] is reconnect.resend_if_lost  # installed when it connected
    terminate(first)
    with caplog.at_level(logging.WARNING, logger="core.reconnect"):
        second = backend_pid(pg)
    assert second != first
    assert "sending the statement again" in caplog.text


def test_inside_a_transaction_the_loss_is_an_error(pg):
    pid = backend_pid(pg)
    pg.set_autocommit(False)
    pg.in_atomic_block = True  # what transaction.atomic(using=...) sets: the transaction dies with the session
    try:
        terminate(pid)
        with pytest.raises(OperationalError), pg.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        pg.in_atomic_block = False
        pg.needs_rollback = False


def test_a_sqlite_connection_gets_no_wrapper(db):
    from django.db import connection

    connection.ensure_connection()
    assert (reconnect.resend_if_lost in connection.execute_wrappers) == (connection.vendor == "postgresql")


@pytest.mark.parametrize(
    ("sql", "write"),
    [
        ("SELECT 1", False),
        ("(SELECT 1) UNION ALL (SELECT 2)", False),
        ("UPDATE t SET a = 1", True),
        ("INSERT INTO t VALUES (1)", True),
    ],
)
def test_only_writes_in_autocommit_count_as_commits(sql, write):
    class Connection:
        in_atomic_block = False
        vclmgr_commits = 0

    connection = Connection()
    reconnect._written(connection, sql)
    assert reconnect.commits(connection) == int(write)


@pytest.mark.django_db
def test_an_error_of_a_live_session_is_not_a_lost_one_on_either_database():
    """What the job runner asks before it puts a job back in the queue (a busy SQLite file, a
    PostgreSQL error on a session that still stands, are the job's own failures)."""
    from django.db import connection

    connection.ensure_connection()
    assert not reconnect.session_lost(OperationalError("database is locked"))
    assert not reconnect.session_lost(ValueError("not a database error"))
