"""The recorder's statement parameters (audit/write_ops.py): each column converted exactly as the
backend's own adapters (and so `Model.save`) convert it, fast paths included."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import TraceEvent
from audit.write_ops import Table


@pytest.mark.django_db
def test_date_times_are_the_backends_own_parameters():
    adapt = connection.ops.adapt_datetimefield_value
    table = Table(TraceEvent, ["created_at"])
    (convert,) = table.converters(connection)
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    values = [
        timezone.now(),
        dt.datetime(2026, 3, 29, 0, 59, 59, 999999, tzinfo=dt.UTC),
        dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC),  # no microseconds: str() drops them, as the adapter
        dt.datetime(2026, 3, 29, 3, 30, tzinfo=paris),  # another zone: converted to the connection's
        None,
    ]
    for value in values:
        assert convert(value) == adapt(value), value


@pytest.mark.django_db
def test_the_compound_statements_parameters_are_bound_as_the_driver_binds_them():
    """`_bound` (one pass over a compound write's parameters) gives the statement mysqlclient's own
    binding gives: text with quotes, backslashes, NUL, `%` and non-BMP characters, NULL, integers, and
    every other type through the driver's `literal`."""
    if connection.vendor != "mysql":
        pytest.skip("the compound statement is MariaDB's")
    from decimal import Decimal

    from audit.write_ops import _bound

    values = [
        "plain",
        'it\'s "quoted" \\ back\\slashed',
        "nul\x00byte and 100% and %s",
        "日志 😀 naïve",
        "",
        None,
        0,
        -7,
        2**63 - 1,
        True,
        False,
        1.5,
        Decimal("12.3400"),
        dt.datetime(2026, 12, 2, 1, 2, 3, 456789),
        b"\x00raw'bytes",
    ]
    sql = "SELECT " + ", ".join(["%s"] * len(values)) + " FROM DUAL WHERE '%%' = '%%'"
    connection.ensure_connection()
    with connection.cursor() as cursor:
        expected = cursor.cursor._mogrify(sql, values)
        assert _bound(connection.connection, sql, values) == expected
        texts = values[:5]
        cursor.execute(_bound(connection.connection, "SELECT " + ", ".join(["%s"] * len(texts)), texts))
        assert list(cursor.fetchone()) == texts  # what the server reads back is what was bound
