"""Ending a request's PostgreSQL session at each of its statements in turn (what the topology
test's "terminate a web machine's database sessions" fault does at a random one)."""

import psycopg
from django.db import connection


class EndSessionAt:
    """An execute wrapper that ends this connection's session (``pg_terminate_backend`` from a
    second connection) just before the ``n``-th statement it sees; ``struck`` says if it came."""

    def __init__(self, n):
        self.n, self.seen, self.struck, self.armed = n, 0, False, False

    def __call__(self, execute, sql, params, many, context):
        self.seen += self.armed
        if self.armed and self.seen == self.n:
            self.struck = True
            terminate(connection.connection.info.backend_pid)
        return execute(sql, params, many, context)


def terminate(pid):
    """End the PostgreSQL session ``pid`` from a second connection (``pg_terminate_backend``)."""
    params = connection.get_connection_params()
    with psycopg.connect(
        host=params.get("host"),
        port=params.get("port"),
        user=params.get("user"),
        dbname=params["dbname"],
        autocommit=True,
    ) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def at_every_statement(request_once):
    """``request_once(fault)`` for a fault at statement 1, 2, … until one request ends before
    its fault came; returns how many statements were struck."""
    assert connection.vendor == "postgresql", "the postgres marker's tests run on the PostgreSQL leg"
    n = 0
    while True:
        n += 1
        fault = EndSessionAt(n)
        with connection.execute_wrapper(fault):
            request_once(fault)
        if not fault.struck:
            return n - 1
        assert n < 200, "a request of over 200 statements"
