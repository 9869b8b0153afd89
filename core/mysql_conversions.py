"""The MySQL driver's value conversions, with date-times parsed by `datetime.fromisoformat`.

`mysqlclient` turns every DATETIME and TIMESTAMP value into a `datetime` in Python code
(`MySQLdb.times.DateTime_or_None`: slicing and seven `int()` calls, ≈ 1 µs a value); a trace read of a
500-event run converts ≈ 1 300 of them. `datetime.fromisoformat` parses the same text in C (≈ 0.1 µs)
and returns the same value for every text the server sends (`YYYY-MM-DD HH:MM:SS[.ffffff]`); whatever
it refuses — a date alone, a zero date, a value out of range — goes to the driver's own function, so
the result is the driver's in every case (`tests/test_mysql_conversions.py`). Used as the connection's
`conv` option (config/settings.py): Django's conversions with these two replaced.
"""

from __future__ import annotations

import datetime as dt
from typing import Any


def datetime_or_none(text: Any) -> Any:
    """`MySQLdb.times.DateTime_or_None(text)`, through `datetime.fromisoformat` when it accepts it."""
    from MySQLdb.times import DateTime_or_None

    if not 11 <= len(text) <= 26:  # a date alone (a `date`), or more than 6 digits of fraction (None)
        return DateTime_or_None(text)
    try:
        return dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return DateTime_or_None(text)


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
