"""A statement whose database connection was lost before it ran is sent again on a new one.

PostgreSQL may drop a session under us: ``pg_terminate_backend``, a restarted server or proxy,
a pooled connection that died while idle. Outside a transaction (autocommit: each statement
is its own) the lost statement did not commit, so it is safe to send once more on a fresh
connection, and the request goes on instead of answering 500. Inside ``atomic`` the
transaction is gone with the session: that error stands (the caller's transaction failed
whole, nothing of it committed). Installed on every PostgreSQL connection as an execute
wrapper (``vclmgr.apps``). Pooled connections are also checked when taken from the pool
(Django does it with ``CONN_HEALTH_CHECKS``); this covers a session dropped while in use.
"""

import logging

from django.db import OperationalError

log = logging.getLogger(__name__)


def install(sender, connection, **kwargs):
    """``connection_created`` receiver."""
    if connection.vendor == "postgresql" and resend_if_lost not in connection.execute_wrappers:
        connection.execute_wrappers.insert(0, resend_if_lost)  # outermost: it survives others popping theirs


def _lost(connection):
    raw = connection.connection
    return raw is None or raw.closed or getattr(raw, "broken", False)


def resend_if_lost(execute, sql, params, many, context):
    try:
        return execute(sql, params, many, context)
    except OperationalError as exc:
        connection, cursor = context["connection"], context["cursor"]
        if connection.in_atomic_block or not _lost(connection):
            raise
        log.warning("database connection lost (%s); sending the statement again on a new one", exc)
        connection.close()  # back to the pool, which discards it
        connection.ensure_connection()
        cursor.cursor = connection.create_cursor()
        return execute(sql, params, many, context)
