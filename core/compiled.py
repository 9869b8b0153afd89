"""Read queries compiled once by the ORM and run again with other parameters.

`CompiledQuery` keeps what the ORM compiled for a QuerySet (which stays each query's one definition),
once per database alias, and executes that SQL with new parameter values through the connection's
cursor (counted and logged like any query), converting columns as Django's compiler would: its rows
are exactly `values_list()`'s. Only for queries whose SQL does not depend on parameter values.
Details: docs/architecture.md, *The read side and reasoning governance*.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

from django.db import connections
from django.db.models import JSONField, Q, QuerySet

from core.db_router import read_alias
from core.mysql_conversions import aware_conversions

_scan = json.JSONDecoder().scan_once


def json_loads(text: str) -> Any:
    """`json.loads(text)` for text read from a JSON column, without its per-call overhead: the decoder's
    scanner over the whole text when it starts with a value and the value ends the text (exactly what
    `json.loads` returns then), `json.loads` itself otherwise (leading or trailing whitespace, errors)."""
    if text and text[0] not in " \t\n\r":
        try:
            value, end = _scan(text, 0)
        except (StopIteration, ValueError):
            return json.loads(text)
        if end == len(text):
            return value
    return json.loads(text)


def _json_column(original: Callable) -> Callable:
    def convert(value: Any, expression: Any, connection: Any) -> Any:
        if value.__class__ is str:
            try:
                return json_loads(value)
            except ValueError:
                pass  # the field's own converter decides (Django returns the text it cannot decode)
        return original(value, expression, connection)

    return convert


def _aware_utc(value: Any, expression: Any, connection: Any) -> Any:
    return None if value is None else value.replace(tzinfo=dt.UTC)


_DATETIME_TYPES: frozenset = frozenset()


def _mysql_datetime_types() -> frozenset:
    global _DATETIME_TYPES
    if not _DATETIME_TYPES:
        from MySQLdb.constants import FIELD_TYPE

        _DATETIME_TYPES = frozenset((FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP))
    return _DATETIME_TYPES


def _aware_converter(raw: Any) -> dict:
    """The driver connection `raw`'s converter with date-times read aware in UTC at once
    (`core.mysql_conversions.aware_utc`), made once per connection and kept on it."""
    conv = raw.converter
    found = getattr(raw, "_compiled_aware", None)
    if found is None or found[0] is not conv:
        found = raw._compiled_aware = (conv, aware_conversions(conv))
    return found[1]


def _fast_converter(fn: Callable, connection: Any) -> Callable:
    """`fn`, or an equivalent that costs less: a JSON column's decoding through `json_loads`; MySQL's
    date-time converter makes the naive value the driver returns aware in the connection's time zone
    (`timezone.make_aware`), which in UTC is `replace(tzinfo=UTC)`."""
    owner = getattr(fn, "__self__", None)
    if (
        isinstance(owner, JSONField)
        and owner.decoder is None
        and type(owner).from_db_value is JSONField.from_db_value
    ):
        return _json_column(fn)
    if (
        connection.vendor == "mysql"
        and getattr(fn, "__name__", "") == "convert_datetimefield_value"
        and connection.timezone is dt.UTC
    ):
        return _aware_utc
    return fn


class _Plan(NamedTuple):
    """A `CompiledQuery` compiled for one database."""

    sql: str
    slots: tuple[str | None, ...]  # per SQL parameter: the call's parameter name, or None (a constant)
    names: tuple[str, ...]
    converters: list  # (column index, converter functions, expression), Django's per column
    template: tuple  # the SQL parameters, a call's own named by their slot
    aware: frozenset[int]  # the columns whose sole conversion makes a MySQL date-time aware in UTC
    driver_aware: bool | None  # whether the driver reads `aware` itself (None: not decided yet)
    remaining: list  # `converters` less `aware` when the driver reads those


class CompiledQuery:
    """A read-only query `build(**params)` compiled once per database alias, run with new `params`.

    `build` returns a QuerySet (values(), values_list() or a model QuerySet) for the given keyword values;
    it is called once per alias with a unique sentinel per parameter (`params`: name → `str` or `int`).
    The compiled SQL's parameters that are a sentinel are replaced by the call's values; the others are
    constants of the query.
    `rows(**params)` returns tuples in the order of `names(alias)`: the select's extra columns, its field
    columns, then its annotations (as `values_list()` without arguments orders them). On MySQL, once the
    first result has shown that every DATETIME column is one Django makes aware in UTC, the driver reads
    them aware at once (`core.mysql_conversions.aware_utc`: one parse instead of three steps a value)."""

    def __init__(self, build: Callable[..., QuerySet], **params: type) -> None:
        self._build = build
        self._params = params
        self._compiled: dict[str, _Plan] = {}

    def _compile(self, alias: str) -> _Plan:
        sentinels: dict[str, Any] = {}
        for i, (name, kind) in enumerate(self._params.items()):
            # An integer sentinel inside the range of a 32-bit column, signed or positive (Django
            # compiles an out-of-range value of an integer lookup to an empty or a full result, without
            # the parameter).
            sentinels[name] = f"\x00compiled:{name}\x00" if kind is str else 2**31 - 1 - 7919 * (i + 1)
        qs = self._build(**sentinels)
        query = qs.query
        compiler = query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        by_value = {(type(v), v): k for k, v in sentinels.items()}
        slots = tuple(by_value.get((type(p), p)) for p in params)
        if {s for s in slots if s is not None} != set(self._params):
            raise ValueError(f"a parameter does not appear in the compiled SQL: {slots}")
        names = (*query.extra_select, *query.values_select, *query.annotation_select)
        if not query.values_select:  # a model QuerySet: its select is the concrete fields
            names = (
                *query.extra_select,
                *(f.attname for f in qs.model._meta.concrete_fields),
                *query.annotation_select,
            )
        fields = [s[0] for s in compiler.select[: compiler.col_count]]
        if len(fields) != len(names):
            raise ValueError("the compiled select does not match its column names")
        connection = connections[alias]
        converters = [
            (i, [_fast_converter(fn, connection) for fn in fns], expr)
            for i, (fns, expr) in compiler.get_converters(fields).items()
        ]
        template = tuple(p if s is None else s for p, s in zip(params, slots, strict=True))
        # The columns whose only conversion makes a MySQL date-time aware in UTC: read aware by the
        # driver instead once the first result showed they are exactly its date-time columns (`rows`).
        aware = frozenset(i for i, fns, _expr in converters if fns == [_aware_utc])
        compiled = _Plan(sql, tuple(slots), names, converters, template, aware, None, converters)
        self._compiled[alias] = compiled
        return compiled

    def names(self, alias: str | None = None) -> tuple[str, ...]:
        alias = alias or read_alias()
        compiled = self._compiled.get(alias) or self._compile(alias)
        return compiled.names

    def rows(self, alias: str | None = None, **params: Any) -> list[Sequence[Any]]:
        """The query's rows for `params` (every parameter named at construction), converted, from
        `alias` or else the database the router sends the current reads to (`core.db_router`)."""
        if alias is None:
            alias = read_alias()
        compiled = self._compiled.get(alias) or self._compile(alias)
        sql, slots, _names, converters, template, _aware, driver_aware, remaining = compiled
        args = [p if s is None else params[s] for p, s in zip(template, slots, strict=True)]
        connection = connections[alias]
        with connection.cursor() as cursor:
            if driver_aware:
                raw = connection.connection
                conv = raw.converter
                raw.converter = _aware_converter(raw)
                try:
                    cursor.execute(sql, args)
                    rows = cursor.fetchall()
                finally:
                    raw.converter = conv
                converters = remaining
            else:
                cursor.execute(sql, args)
                rows = cursor.fetchall()
                if driver_aware is None:
                    self._decide(alias, compiled, cursor.description, connection)
        if not converters:
            return list(rows)  # MySQLdb's fetchall is a tuple: the contract is a list either way
        out = []
        for row in rows:
            row = list(row)
            for i, fns, expr in converters:
                value = row[i]
                for fn in fns:
                    value = fn(value, expr, connection)
                row[i] = value
            out.append(row)
        return out

    def _decide(self, alias: str, compiled: _Plan, description: Any, connection: Any) -> None:
        """Whether later runs read the date-time columns aware from the driver: only when every column
        the server sent as a DATETIME or TIMESTAMP is one whose sole conversion makes it aware in UTC,
        and each of those is one (so no column is read differently from Django's conversion)."""
        aware = compiled.aware
        sent = None
        if aware and connection.vendor == "mysql" and description is not None:
            types = _mysql_datetime_types()
            sent = frozenset(i for i, column in enumerate(description) if column[1] in types)
        if sent == aware:
            remaining = [c for c in compiled.converters if c[0] not in aware]
            self._compiled[alias] = compiled._replace(driver_aware=True, remaining=remaining)
        else:
            self._compiled[alias] = compiled._replace(driver_aware=False)


class RowsOfRun:
    """The rows of `model` stored under one run id, in `order`, as attribute bags of every concrete
    column under its attribute name (the digests cover every column) and `pk`, without model instances;
    one query compiled once (`CompiledQuery`), with `annotations` (name → expression) added. `match`:
    the filter for a run id (default: the `run_id` column)."""

    def __init__(self, model, order: Sequence[str], *, match=None, **annotations: Any) -> None:
        self._pk = model._meta.pk.attname
        match = match or (lambda run_id: Q(run_id=run_id))
        self._query = CompiledQuery(
            lambda run_id: model.objects.filter(match(run_id)).order_by(*order).annotate(**annotations),
            run_id=str,
        )

    def __call__(self, run_id: str) -> list[SimpleNamespace]:
        names = self._query.names()
        pk = names.index(self._pk)
        out = []
        for row in self._query.rows(run_id=run_id):
            bag = SimpleNamespace()  # filled through its dict: no keyword dict built per row
            attributes = bag.__dict__
            attributes.update(zip(names, row, strict=True))
            attributes["pk"] = row[pk]
            out.append(bag)
        return out
