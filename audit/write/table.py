"""How a model's rows become SQL and parameters for the recorder's writes (`audit.write.ops`).

`Table` holds one model's columns in a fixed order, builds its INSERT (plain, guarded by a condition, with
`RETURNING`) and UPDATE statements from the model's own field definitions (quoted column names; values
are always parameters) and caches them per connection, and converts each value exactly as `Model.save`
would (the fields' own database preparation for JSON, date-times and the encrypted reasoning text, with
fast paths that give the same result: `tests/audit/test_write_ops.py`). `RawJSON` is JSON text the caller
already serialised (the recorder's canonical details), stored as is. No statement is executed here.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper


class RawJSON:
    """JSON text already serialised by the caller (the recorder's canonical details): stored as is."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


@functools.cache
def json_text(encoder: type[json.JSONEncoder] | None) -> Callable[[Any], str]:
    """`json.dumps(value, cls=encoder)` (how a JSON column serialises a value) as one encoder made once
    per class: `json.dumps` builds a new encoder per call with these same default options."""
    return (encoder or json.JSONEncoder)().encode


def _char(value: Any) -> Any:
    return value if value is None or type(value) is str else str(value)


class Table:
    """INSERT/UPDATE building for one model: its columns in a fixed order and each column's conversion
    from a Python value to the database parameter (the same conversion `Model.save` applies)."""

    def __init__(self, model: type[models.Model], columns: Sequence[str]) -> None:
        self.model = model
        self.db_table = model._meta.db_table
        self.columns = tuple(columns)
        self.fields = [model._meta.get_field(c) for c in self.columns]
        self.index = {c: i for i, c in enumerate(self.columns)}
        self.pk_column = model._meta.pk.column
        self._sql: dict[tuple, str] = {}
        self._converters: dict[str, list[Callable[[Any], Any] | None]] = {}

    def row(self, **values: Any) -> tuple:
        """A row in column order; a column not given takes the model field's default (as `Model()`)."""
        if len(values) == len(self.columns):
            # Every column given (the recorder's own rows): the same tuple without the defaults' loop.
            try:
                return tuple([values[c] for c in self.columns])
            except KeyError:
                pass  # an unknown column in place of a known one: the loop below names it
        out = []
        used = 0
        for name, f in zip(self.columns, self.fields, strict=True):
            if name in values:
                out.append(values[name])
                used += 1
            else:
                out.append(f.get_default())
        if used != len(values):
            raise KeyError(f"unknown columns for {self.db_table}: {sorted(set(values) - set(self.columns))}")
        return tuple(out)

    def column(self, name: str) -> str:
        return self.model._meta.get_field(name).column

    def converters(self, connection: BaseDatabaseWrapper) -> list[Callable[[Any], Any] | None]:
        found = self._converters.get(connection.alias)
        if found is None:
            found = [self._converter(f, connection) for f in self.fields]
            self._converters[connection.alias] = found
        return found

    @staticmethod
    def _converter(f: models.Field, connection: BaseDatabaseWrapper) -> Callable[[Any], Any] | None:
        if isinstance(f, models.JSONField):
            if connection.vendor in ("mysql", "sqlite"):
                dumps = json_text(f.encoder)

                def to_json(value: Any) -> Any:
                    if isinstance(value, RawJSON):
                        return value.text
                    return dumps(value)

                return to_json
            return lambda value: f.get_db_prep_save(
                json.loads(value.text) if isinstance(value, RawJSON) else value, connection
            )
        if type(f) in (models.CharField, models.TextField) or (
            isinstance(f, models.ForeignKey) and type(f.target_field) in (models.CharField, models.TextField)
        ):
            return _char
        if type(f) is models.DateTimeField:
            return _datetime_converter(connection)
        if type(f) in (
            models.IntegerField,
            models.BigIntegerField,
            models.PositiveIntegerField,
            models.BooleanField,
        ):
            return None
        # Anything else (e.g. the encrypted reasoning text): the field's own preparation.
        return lambda value: f.get_db_prep_save(value, connection)

    def prep(self, connection: BaseDatabaseWrapper, values: Sequence[Any]) -> list[Any]:
        return [v if c is None else c(v) for c, v in zip(self.converters(connection), values, strict=True)]

    def prep_columns(self, connection: BaseDatabaseWrapper, columns: Sequence[str], values: Sequence[Any]):
        convs = self.converters(connection)
        out = []
        for name, value in zip(columns, values, strict=True):
            conv = convs[self.index[name]]
            out.append(value if conv is None else conv(value))
        return out

    def insert_sql(self, connection: BaseDatabaseWrapper, rows: int, returning: bool) -> str:
        key = (connection.alias, "insert", rows, returning)
        sql = self._sql.get(key)
        if sql is None:
            qn = connection.ops.quote_name
            cols = ", ".join(qn(f.column) for f in self.fields)
            one = "(" + ", ".join(["%s"] * len(self.fields)) + ")"
            # Identifiers come from the model definitions (quoted), values are always parameters.
            sql = f"INSERT INTO {qn(self.db_table)} ({cols}) VALUES " + ", ".join([one] * rows)  # noqa: S608
            if returning:
                sql += f" RETURNING {qn(self.pk_column)}"
            self._sql[key] = sql
        return sql

    def guarded_insert_sql(
        self, connection: BaseDatabaseWrapper, rows: int, returning: bool, guard: str
    ) -> str:
        """INSERT of `rows` rows, each written only when `guard` (an SQL condition) holds."""
        key = (connection.alias, "guarded", rows, returning, guard)
        sql = self._sql.get(key)
        if sql is None:
            qn = connection.ops.quote_name
            cols = ", ".join(qn(f.column) for f in self.fields)
            dual = " FROM DUAL" if connection.vendor == "mysql" else ""
            one = "SELECT " + ", ".join(["%s"] * len(self.fields)) + f"{dual} WHERE {guard}"
            sql = f"INSERT INTO {qn(self.db_table)} ({cols}) " + " UNION ALL ".join([one] * rows)
            if returning:
                sql += f" RETURNING {qn(self.pk_column)}"
            self._sql[key] = sql
        return sql

    def update_sql(self, connection: BaseDatabaseWrapper, columns: tuple, where: tuple) -> str:
        key = (connection.alias, "update", columns, where)
        sql = self._sql.get(key)
        if sql is None:
            qn = connection.ops.quote_name
            sets = ", ".join(f"{qn(self.column(c))} = %s" for c in columns)
            cond = " AND ".join(f"{qn(self.column(c))} = %s" for c in where)
            sql = f"UPDATE {qn(self.db_table)} SET {sets} WHERE {cond}"  # noqa: S608
            self._sql[key] = sql
        return sql


# `str()` of a naive `datetime`: `isoformat(" ")`, its fraction only when there are microseconds.
_NAIVE = "%04d-%02d-%02d %02d:%02d:%02d"
_NAIVE_MICRO = _NAIVE + ".%06d"


def _datetime_converter(connection: BaseDatabaseWrapper) -> Callable[[Any], Any]:
    """The backend's `adapt_datetimefield_value`, with a fast path for what the recorder writes: an
    aware UTC `datetime` on a connection whose time zone is UTC (MySQL/MariaDB and SQLite with
    `USE_TZ`), where the adapter's own checks and its conversion to the connection's zone return the
    same naive time as `str` (tested equal in `tests/audit/test_write_ops.py`)."""
    adapt = connection.ops.adapt_datetimefield_value
    if not (settings.USE_TZ and connection.vendor in ("mysql", "sqlite") and connection.timezone is dt.UTC):
        return adapt

    def utc_datetime(value: Any) -> Any:
        if type(value) is dt.datetime and value.tzinfo is dt.UTC:
            # `str(value.replace(tzinfo=None))`, formatted here: the C `isoformat` behind `str` formats
            # through printf, several times the cost (a run writes about sixty date-times).
            if value.microsecond:
                return _NAIVE_MICRO % (
                    value.year,
                    value.month,
                    value.day,
                    value.hour,
                    value.minute,
                    value.second,
                    value.microsecond,
                )
            return _NAIVE % (value.year, value.month, value.day, value.hour, value.minute, value.second)
        return adapt(value)

    return utc_datetime
