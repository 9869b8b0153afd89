"""The cursor the recorder's writes run on (`audit.write.ops`), and the compound statement's results.

`cursor_for(connection)` is Django's cursor, or, on MariaDB/MySQL outside any transaction of the
caller's, with no execute wrapper installed and no query logged (production), the driver's own
(`DriverCursor`) with the checks and error translation of Django's and one-pass parameter binding
(`bind_params`: the same bytes as the driver's own). `results_of` runs a compound statement and drains
every result set, so that an error raised by a later statement surfaces before anything counts as
written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


def results_of(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> list[tuple]:
    """Run the compound statement `sql` with its `params` and drain every result (one per RETURNING,
    then the statement's own status): an error raised by a later statement (and the rollback) surfaces
    here, so nothing counts as written before."""
    with cursor_for(connection) as cursor:
        cursor.execute(sql, params)
        sets = [cursor.fetchall()]
        with connection.wrap_database_errors:
            while _next_result(connection, cursor):
                sets.append(cursor.fetchall())
    return sets


def cursor_for(connection: BaseDatabaseWrapper):
    """The cursor a write runs on: Django's, or on MariaDB/MySQL outside any transaction of the
    caller's, with no execute wrapper installed and no query logged (production), the driver's own
    (`DriverCursor`), which makes the checks and error translation of Django's and binds parameters
    in one pass (`bind_params`). Django's two wrapper layers around every cursor method were ≈ 5 % of the
    instructions of a run recorded one at a time and add nothing else in that case."""
    if (
        connection.vendor != "mysql"
        or connection.queries_logged
        or connection.execute_wrappers
        or connection.in_atomic_block
    ):
        return connection.cursor()
    return DriverCursor(connection)


class DriverCursor:
    """The driver's cursor on `connection`, with what Django's cursor does for a write here: the
    checks of `cursor()` (health check, connection, thread sharing), Django's database errors
    (`wrap_database_errors`, and the MySQL backend's own cursor wrapper for its IntegrityError codes)
    and the driver's parameter binding, in one pass (`bind_params`, the same bytes as the driver's own),
    without Django's generic cursor layer. A context manager that closes the cursor as Django's does
    (errors on close ignored)."""

    __slots__ = ("_connection", "_cursor", "_raw", "_translated")

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        from django.db.backends.mysql.base import CursorWrapper

        connection.close_if_health_check_failed()
        connection.ensure_connection()
        connection.validate_thread_sharing()
        self._connection = connection
        self._raw = connection.connection
        with connection.wrap_database_errors:
            self._cursor = self._raw.cursor()
        self._translated = CursorWrapper(self._cursor)

    def __enter__(self) -> DriverCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(self._connection.Database.Error):
            self._cursor.close()

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        with self._connection.wrap_database_errors:
            # As the driver: no parameters, no `%` formatting.
            self._translated.execute(sql if params is None else bind_params(self._raw, sql, params))

    def fetchall(self) -> tuple:
        with self._connection.wrap_database_errors:
            return self._cursor.fetchall()

    def fetchone(self) -> Any:
        with self._connection.wrap_database_errors:
            return self._cursor.fetchone()

    def nextset(self) -> bool | None:
        return self._cursor.nextset()

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int:
        return self._cursor.lastrowid


def _integrity_codes(connection: BaseDatabaseWrapper) -> tuple[int, ...]:
    """The driver error codes the MySQL backend's cursor raises as IntegrityError."""
    from django.db.backends.mysql.base import CursorWrapper

    return CursorWrapper.codes_for_integrityerror


def bind_params(raw: Any, sql: str, params: Sequence[Any]) -> bytes:
    """`sql` with `params` bound as mysqlclient binds them (`MySQLdb.cursors.BaseCursor._mogrify`: each
    value as `Connection.literal` escapes it, then `%` formatting), in one pass: text goes straight to
    the driver's `string_literal`, NULL, integers and booleans (the driver's `1`/`0`) need no escaping,
    every other value takes `literal`. A compound write binds ≈ 40 values per decision; the driver's
    per-value dispatch was about a tenth of a concurrent run's CPU (docs/performance.md, B1
    concurrent). The statement is bytes, as the driver sends it: code that wraps the driver's cursor
    sees bytes for these writes."""
    string_literal, encoding, literal = raw.string_literal, raw.encoding, raw.literal
    values = tuple(
        [
            string_literal(v.encode(encoding))
            if type(v) is str
            else b"NULL"
            if v is None
            else b"%d" % v
            if type(v) is int
            else (b"1" if v else b"0")
            if type(v) is bool
            else literal(v)
            for v in params
        ]
    )
    return sql.encode(encoding) % values


def _next_result(connection, cursor) -> bool:
    """`cursor.nextset()` with the MySQL backend's own error translation (as for `execute`)."""
    from django.db import IntegrityError

    try:
        return bool(cursor.nextset())
    except connection.Database.OperationalError as exc:
        if exc.args and exc.args[0] in _integrity_codes(connection):
            raise IntegrityError(*tuple(exc.args)) from exc
        raise
