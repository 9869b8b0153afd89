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
