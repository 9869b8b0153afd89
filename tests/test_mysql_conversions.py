"""The MySQL connections parse date-times with `datetime.fromisoformat` (core/mysql_conversions.py): the
driver's own result for every text, and what the server sends read back unchanged."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from core.mysql_conversions import datetime_or_none

MySQLdb_times = pytest.importorskip("MySQLdb.times")

TEXTS = [
    "2026-12-06 15:14:36.073566",
    "2026-12-06 15:14:36.000001",
    "2026-12-06 15:14:36",
    "2026-12-06 15:14:36.07",
    "2026-12-06 15:14:36.1234567",  # more digits than the driver takes: None, as the driver gives
    "1000-01-01 00:00:00",
    "9999-12-31 23:59:59.999999",
    "0000-00-00 00:00:00",
    "2026-02-30 00:00:00",
    "2026-12-06",
    "0000-00-00",
    "2026-12-06 15:14",
    "",
    "garbage text here",
]


@pytest.mark.parametrize("text", TEXTS)
def test_the_drivers_result_for_every_text(text):
    expected = MySQLdb_times.DateTime_or_None(text)
    assert datetime_or_none(text) == expected
    assert type(datetime_or_none(text)) is type(expected)


@pytest.mark.django_db
def test_a_mysql_connection_reads_date_times_through_it():
    if connection.vendor != "mysql":
        pytest.skip("MySQL connections only")
    from MySQLdb.constants import FIELD_TYPE

    connection.ensure_connection()
    assert connection.connection.converter[FIELD_TYPE.DATETIME] is datetime_or_none
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CAST('2026-12-06 15:14:36.073566' AS DATETIME(6)), CAST('2026-12-06' AS DATETIME), "
            "CAST('2026-12-06' AS DATE)"
        )
        row = cursor.fetchone()
    assert row[0].replace(tzinfo=None) == dt.datetime(2026, 12, 6, 15, 14, 36, 73566)
    assert row[1].replace(tzinfo=None) == dt.datetime(2026, 12, 6)
    assert row[2] == dt.date(2026, 12, 6)


def _composed(text):
    """What a UTC connection's column gave before: the connection's value, then `replace(tzinfo=UTC)`."""
    value = datetime_or_none(text)
    return None if value is None else value.replace(tzinfo=dt.UTC)


@pytest.mark.parametrize("text", [*TEXTS, "2026-12-06 15:14:36+01:00", "2026-12-06T15:14:36.123456"])
def test_aware_utc_is_the_drivers_value_made_aware(text):
    from core.mysql_conversions import aware_utc

    try:
        expected = _composed(text)
    except TypeError:  # a date alone: it has no time zone to set, as before
        with pytest.raises(TypeError):
            aware_utc(text)
        return
    got = aware_utc(text)
    assert got == expected and type(got) is type(expected)
    if got is not None:
        assert got.tzinfo is dt.UTC and got.isoformat() == expected.isoformat()
