"""Fast bulk writes (the host import, the event outbox, job logs): one statement per batch.

``QuerySet.bulk_create`` compiles SQL for every value of every row; for tens of
thousands of rows that compile time dominates an import. Here each value is still
prepared by its Django field (``get_db_prep_save``), so JSON, dates and foreign keys are
stored exactly as the ORM would, and the rows go in with one prepared ``executemany``
(SQLite, in-process) or one ``COPY`` (PostgreSQL, one round trip).
"""

import gc
from contextlib import contextmanager

from django.db import connections, router
from django.utils import timezone

BATCH = 2000


def insert_rows(model, names, rows, *, returning=None, first=None):
    """INSERT ``rows`` (tuples of Python values, in ``names`` order) into ``model``'s table.

    Without ``returning``: one prepared ``executemany`` (SQLite) or one ``COPY`` (PostgreSQL)
    per batch, and None. With ``returning`` (a field name): multi-row ``INSERT … RETURNING``
    statements, and that column of the new rows in order (as ``bulk_create`` relies on for
    SQLite ≥ 3.35 and PostgreSQL).

    ``first``: ``(model, names, rows)`` to insert before (no ``returning``). On PostgreSQL, when
    both fit one batch, in the same statement (a data-modifying ``WITH``): a transaction's
    change-log rows and events in one round trip instead of two.
    """
    connection = connections[router.db_for_write(model)]
    if first and first[2]:
        if connection.vendor == "postgresql" and rows and max(len(rows), len(first[2])) <= BATCH:
            return _insert_after(connection, first, model, names, rows, returning)
        insert_rows(*first)  # (apart: SQLite has no INSERT in a WITH; a big batch goes as COPY)
    quote = connection.ops.quote_name
    table, columns, prepare = _prepared(connection, model, names)
    returned = []
    with connection.cursor() as cursor:
        for start in range(0, len(rows), BATCH):
            params = prepare(rows[start : start + BATCH])
            if returning:
                column = quote(model._meta.get_field(returning).column)
                sql, values = _values(table, columns, params)
                cursor.execute(f"{sql} RETURNING {column}", values)
                returned.extend(row[0] for row in cursor.fetchall())
            elif connection.vendor == "postgresql":
                copy_batch(cursor, table, columns, params)
            else:
                one = "(" + ", ".join(["%s"] * len(names)) + ")"
                cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES {one}", params)
    return returned if returning else None


def copy_batch(cursor, table, columns, params):
    """One ``COPY`` of prepared rows (PostgreSQL): streamed in one round trip; psycopg adapts
    each value as it would for a parameter (Jsonb, timestamps, …). Django's query capture does
    not see it (the statement benchmark counts it here)."""
    with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for row in params:
            copy.write_row(row)


def _insert_after(connection, first, model, names, rows, returning):
    """``first``'s rows then ``rows``, one batch each, in one statement (PostgreSQL)."""
    table, columns, prepare = _prepared(connection, *first[:2])
    before, before_params = _values(table, columns, prepare(first[2]))
    table, columns, prepare = _prepared(connection, model, names)
    sql, params = _values(table, columns, prepare(rows))
    if returning:
        sql += f" RETURNING {connection.ops.quote_name(model._meta.get_field(returning).column)}"
    with connection.cursor() as cursor:
        cursor.execute(f"WITH first AS ({before}) {sql}", [*before_params, *params])
        return [row[0] for row in cursor.fetchall()] if returning else None


def _prepared(connection, model, names):
    """The quoted table and columns of ``names``, and a function preparing rows for them (each
    value by its Django field, as the ORM would store it)."""
    fields = [model._meta.get_field(name) for name in names]
    quote = connection.ops.quote_name

    def prepare(rows):
        return [
            [field.get_db_prep_save(value, connection) for field, value in zip(fields, row, strict=True)]
            for row in rows
        ]

    return quote(model._meta.db_table), ", ".join(quote(f.column) for f in fields), prepare


def _values(table, columns, params):
    """A multi-row ``INSERT … VALUES`` of prepared rows, and its parameters."""
    one = "(" + ", ".join(["%s"] * len(params[0])) + ")"
    values = ", ".join([one] * len(params))
    return f"INSERT INTO {table} ({columns}) VALUES {values}", [value for row in params for value in row]


def insert_instances(model, instances):
    """INSERT unsaved instances (every concrete field but the auto primary key).

    Primary keys are not set here: the caller reads them back by a unique key.
    """
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    now = timezone.now()
    rows = []
    for obj in instances:
        for f in fields:
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                setattr(obj, f.attname, now)
        rows.append(tuple(getattr(obj, f.attname) for f in fields))
    insert_rows(model, [f.name for f in fields], rows)


def update_instances(model, instances, field_names):
    """UPDATE ``field_names`` of saved instances, one prepared statement for all rows.

    (``QuerySet.bulk_update`` builds a CASE expression per field over each batch, which
    grows slow with thousands of rows.)
    """
    if not instances:
        return
    connection = connections[router.db_for_write(model)]
    fields = [model._meta.get_field(name) for name in field_names]
    quote = connection.ops.quote_name
    sql = "UPDATE {} SET {} WHERE {} = %s".format(
        quote(model._meta.db_table),
        ", ".join(f"{quote(f.column)} = %s" for f in fields),
        quote(model._meta.pk.column),
    )
    with connection.cursor() as cursor:
        for start in range(0, len(instances), BATCH):
            params = [
                [*(f.get_db_prep_save(getattr(obj, f.attname), connection) for f in fields), obj.pk]
                for obj in instances[start : start + BATCH]
            ]
            cursor.executemany(sql, params)


@contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while building many short-lived objects.

    Each full collection walks every live object, so with tens of thousands of rows in
    memory they make an import grow faster than linearly. Reference counting still frees
    memory meanwhile; the collector resumes (and runs) at the end.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
