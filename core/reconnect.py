"""A statement whose database connection was lost before it ran is sent again on a new one.

PostgreSQL may drop a session under us: ``pg_terminate_backend``, a restarted server or proxy,
a pooled connection that died while idle. Outside a transaction (autocommit: each statement
is its own) the lost statement did not commit, so it is safe to send once more on a fresh
connection, and the request goes on instead of answering 500. Inside ``atomic`` the
transaction is gone with the session: that error stands (the caller's transaction failed
whole, nothing of it committed). Installed on every PostgreSQL connection as an execute
wrapper (``core.apps``). Pooled connections are also checked when taken from the pool
(Django does it with ``CONN_HEALTH_CHECKS``); this covers a session dropped while in use.
"""

import logging
from contextlib import contextmanager

from django.db import OperationalError

log = logging.getLogger(__name__)


def install(sender, connection, **kwargs):
    """``connection_created`` receiver."""
    if connection.vendor == "postgresql" and resend_if_lost not in connection.execute_wrappers:
        connection.execute_wrappers.insert(0, resend_if_lost)  # outermost: it survives others popping theirs
        _count_commits(connection)


SESSION_ENDED = ("57P01", "57P02", "57P03")  # admin shutdown (pg_terminate_backend), crash, not yet


def _lost(connection, exc=None):
    """Is the session gone: the driver says so, or the server ended it (its error says which)?
    An error without an SQLSTATE is one the server never sent: the connection itself failed."""
    raw = connection.connection
    if raw is None or raw.closed or getattr(raw, "broken", False):
        return True
    cause = getattr(exc, "__cause__", None)
    if cause is None or not hasattr(cause, "sqlstate"):
        return False
    return cause.sqlstate in SESSION_ENDED or cause.sqlstate is None


def session_lost(exc):
    """Did ``exc`` (or what raised it) come from a database session that is gone? Then the
    transaction it was in rolled back whole: nothing of it committed."""
    from django.db import connection

    if connection.vendor != "postgresql":  # SQLite's errors (a busy file) are not lost sessions
        return False
    errors = (exc, exc.__cause__, exc.__context__)
    return any(isinstance(error, OperationalError) and _lost(connection, error) for error in errors)


def resend_if_lost(execute, sql, params, many, context):
    try:
        result = execute(sql, params, many, context)
    except OperationalError as exc:
        connection, cursor = context["connection"], context["cursor"]
        if connection.in_atomic_block or not _lost(connection, exc):
            raise
        log.warning("database connection lost (%s); sending the statement again on a new one", exc)
        connection.close()  # back to the pool, which discards it
        connection.ensure_connection()
        cursor.cursor = connection.create_cursor()
        result = execute(sql, params, many, context)
    _written(context["connection"], sql)
    return result


# --- a request whose transaction died with its session -------------------------------------

WRITE_SKIP = ("SELECT", "SHOW", "SET", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
LOST, RETRIED = "_vclmgr_session_lost", "_vclmgr_retried"


def _count_commits(connection):
    """Count what this connection commits: ``connection.vclmgr_commits`` (a write in autocommit,
    or an outermost ``atomic`` block's COMMIT)."""
    if hasattr(connection, "vclmgr_commits"):
        return
    connection.vclmgr_commits = 0
    commit = connection.commit

    def counted_commit():
        commit()
        connection.vclmgr_commits += 1

    connection.commit = counted_commit


def commits(connection):
    return getattr(connection, "vclmgr_commits", 0)


@contextmanager
def repeatable():
    """Writes in it are safe to make twice (a token's last use): they do not stop a request
    from running again."""
    from django.db import connection

    mark = commits(connection)
    try:
        yield
    finally:
        if hasattr(connection, "vclmgr_commits"):
            connection.vclmgr_commits = mark


def _written(connection, sql):
    words = sql.lstrip().split(None, 1) if isinstance(sql, str) else ["?"]
    # A compound query (``(SELECT …) UNION ALL (SELECT …)``) opens with a parenthesis.
    if not connection.in_atomic_block and words and words[0].lstrip("(").upper() not in WRITE_SKIP:
        connection.vclmgr_commits = commits(connection) + 1


class RetryLostSessionMiddleware:
    """The innermost middleware: a view whose database session was dropped (its transaction lost
    with it) runs once more on a new connection, if nothing of the request had committed before
    (counted on the connection: an autocommit write, an outermost ``atomic``'s COMMIT) and its
    body can be read again (kept in memory: not a multipart upload, within
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``). Otherwise the error stands."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.db import connection

        rereadable = _keep_body(request)
        mark = commits(connection)
        try:
            response = self.get_response(request)
        except OperationalError:
            if not self._again(request, rereadable, mark, connection):
                raise
            return self.get_response(request)
        if self._again(request, rereadable, mark, connection):
            response = self.get_response(request)
        return response

    def _again(self, request, rereadable, mark, connection):
        lost = getattr(request, LOST, False)
        setattr(request, LOST, False)
        if not lost or not rereadable or getattr(request, RETRIED, False) or commits(connection) != mark:
            return False
        setattr(request, RETRIED, True)
        if not connection.in_atomic_block:
            connection.close()  # the next statement connects afresh (a pooled one is discarded)
        _rewind(request)
        log.warning(
            "%s %s: its database session was dropped before it committed; running it again",
            request.method,
            request.path,
        )
        return True

    def process_exception(self, request, exception):
        from django.db import connection

        if isinstance(exception, OperationalError) and connection.vendor == "postgresql":
            if _lost(connection, exception):
                setattr(request, LOST, True)
        return None


def _keep_body(request):
    from django.conf import settings

    if request.method in ("GET", "HEAD", "OPTIONS"):
        return True
    if request.content_type.startswith("multipart/"):
        return False
    try:
        length = int(request.META["CONTENT_LENGTH"])
    except (KeyError, ValueError):  # no length said: not read into memory here
        return False
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and length > limit:
        return False
    try:
        request.body  # noqa: B018 (read into memory: a second run reads it again)
    except Exception:  # noqa: BLE001 (already streamed: it cannot be read twice)
        return False
    return True


def _rewind(request):
    import io

    if hasattr(request, "_body"):
        request._stream = io.BytesIO(request._body)
        request._read_started = False
    for cached in ("_post", "_files", "_full_data", "_data"):
        if cached in request.__dict__:
            delattr(request, cached)
