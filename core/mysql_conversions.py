"""The MySQL driver's value conversions, with date-times parsed by `datetime.fromisoformat`.

`mysqlclient` turns every DATETIME and TIMESTAMP value into a `datetime` in Python code
(`MySQLdb.times.DateTime_or_None`: slicing and seven `int()` calls, ≈ 1 µs a value); a trace read of a
500-event run converts ≈ 1 300 of them. `datetime.fromisoformat` parses the same text in C (≈ 0.1 µs)
and returns the same value for every text the server sends (`YYYY-MM-DD HH:MM:SS[.ffffff]`); whatever
it refuses goes to the driver's own function, so the result is the driver's in every case; `aware_utc`
is that value made aware in UTC, parsed at once (`tests/test_mysql_conversions.py`). Used as the
connection's `conv` option (config/settings.py) and by `core.compiled` for its date-time columns.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

_fromisoformat = dt.datetime.fromisoformat
_combine = dt.datetime.combine
_UTC = dt.UTC
_driver: Any = None  # MySQLdb.times.DateTime_or_None, imported on first use (not per value)


def _driver_parse(text: Any) -> Any:
    global _driver
    if _driver is None:
        from MySQLdb.times import DateTime_or_None

        _driver = DateTime_or_None
    return _driver(text)


def datetime_or_none(text: Any) -> Any:
    """`MySQLdb.times.DateTime_or_None(text)`, through `datetime.fromisoformat` when it accepts it."""
    if not 11 <= len(text) <= 26:  # a date alone (a `date`), or more than 6 digits of fraction (None)
        return _driver_parse(text)
    try:
        return _fromisoformat(text)
    except (TypeError, ValueError):
        return _driver_parse(text)


def aware_utc(text: Any) -> Any:
    """`datetime_or_none(text)` made aware in UTC as Django's converter makes a naive value read from a
    UTC connection (`value.replace(tzinfo=UTC)`; None stays None), the server's two spellings parsed
    with their offset in one call; anything else through exactly that composition."""
    n = len(text)
    if (n == 26 or n == 19) and text[10] == " ":
        try:
            return _fromisoformat(text + "+00:00")
        except ValueError:
            pass  # out of range, a zero date: as the driver reads it
    value = datetime_or_none(text)
    return None if value is None else value.replace(tzinfo=_UTC)


def conversions() -> dict:
    """Django's MySQL conversions (`django.db.backends.mysql.base.django_conversions`) with DATETIME and
    TIMESTAMP parsed by `datetime_or_none`."""
    from django.db.backends.mysql.base import django_conversions
    from MySQLdb.constants import FIELD_TYPE

    return {
        **django_conversions,
        FIELD_TYPE.DATETIME: datetime_or_none,
        FIELD_TYPE.TIMESTAMP: datetime_or_none,
    }


def aware_conversions(conv: dict) -> dict:
    """`conv` (a connection's converter) with DATETIME and TIMESTAMP read by `aware_utc`."""
    from MySQLdb.constants import FIELD_TYPE

    return {**conv, FIELD_TYPE.DATETIME: aware_utc, FIELD_TYPE.TIMESTAMP: aware_utc}
