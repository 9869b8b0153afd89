"""The recorder's statement parameters (audit/write/table.py, audit/write/cursor.py): each column
converted exactly as the backend's own adapters (and so `Model.save`) convert it, fast paths included."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import TraceEvent
from audit.write.table import Table
from reasoning.models import AgentReasoningAudit


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
    # The fast path formats the text itself: every field's width, with and without a fraction.
    values += [
        dt.datetime(1, 1, 1, tzinfo=dt.UTC),
        dt.datetime(999, 2, 3, 4, 5, 6, 7, tzinfo=dt.UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 6, 9, 8, 7, 60, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 6, 9, 8, 7, fold=1, tzinfo=dt.UTC),
    ]
    for value in values:
        assert convert(value) == adapt(value), value
        if value is not None and value.tzinfo is dt.UTC:
            assert convert(value) == str(value.replace(tzinfo=None)), value


@pytest.mark.django_db
def test_the_compound_statements_parameters_are_bound_as_the_driver_binds_them():
    """`bind_params` (one pass over a compound write's parameters) gives the statement mysqlclient's own
    binding gives: text with quotes, backslashes, NUL, `%` and non-BMP characters, NULL, integers, and
    every other type through the driver's `literal`."""
    if connection.vendor != "mysql":
        pytest.skip("the compound statement is MariaDB's")
    from decimal import Decimal

    from audit.write.cursor import bind_params

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
        assert bind_params(connection.connection, sql, values) == expected
        texts = values[:5]
        cursor.execute(bind_params(connection.connection, "SELECT " + ", ".join(["%s"] * len(texts)), texts))
        assert list(cursor.fetchone()) == texts  # what the server reads back is what was bound


@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_writes_outside_a_transaction_use_the_drivers_cursor_with_djangos_errors(user, monkeypatch):
    """In production (no caller's transaction, no execute wrapper, queries not logged) the recorder's
    statements run on the driver's cursor (`audit.write.cursor.DriverCursor`): the rows land, a server
    error is Django's error class (the MySQL backend's IntegrityError codes included), nothing of a
    failed transaction is stored; while queries are logged (DEBUG, a test capturing them) Django's
    cursor runs and logs them."""
    from django.db import IntegrityError
    from django.test.utils import CaptureQueriesContext

    from audit.verify.hash_chain import verify_chain
    from audit.write import RunRecorder, cursor, ops
    from audit.write.rows import tables as _tables
    from diagnosis import services
    from tests.audit.support import reasoning_row
    from tests.factories import record_full_run

    seen = []
    driver_execute = cursor.DriverCursor.execute

    def spy(cursor, sql, params=None):
        seen.append(sql.lstrip()[:16])
        return driver_execute(cursor, sql, params)

    monkeypatch.setattr(cursor.DriverCursor, "execute", spy)
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="driver cursor")
    assert not connection.in_atomic_block and not connection.queries_logged
    record_full_run(run, recorder=RunRecorder.for_run(run, group_commit=False))
    assert any(s.startswith("BEGIN NOT ATOMIC") for s in seen)  # the compound transactions
    assert any(s.startswith(("INSERT", "UPDATE")) for s in seen)  # the single statements
    run.refresh_from_db()
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    assert len(events) == run.expected_events and verify_chain(events).valid
    assert run.audit_write_failures == 0 and run.audit_complete

    t = _tables()
    now = timezone.now()

    def event(sequence_no, phase):
        return ops.Insert(
            t.event,
            t.event.row(
                run_id=run.run_id,
                session_id=run.session_id,
                sequence_no=sequence_no,
                phase=phase,
                event_type="X",
                status="X",
                summary="",
                details=ops.RawJSON("{}"),
                prev_hash="0" * 64,
                hash="1" * 64,
                created_at=now,
            ),
        )

    reasoning = reasoning_row(run, step_index=99)
    # 1048 (a NULL in a NOT NULL column): the driver's OperationalError, Django's IntegrityError; alone
    # (one statement) and in a compound transaction, whose other row is rolled back with it.
    with pytest.raises(IntegrityError):
        ops.execute([ops.WriteOp(inserts=[event(900, None)])], connection)
    with pytest.raises(IntegrityError):
        ops.execute([ops.WriteOp(inserts=[reasoning, event(901, None)])], connection)
    # 1062 (a duplicate key): the driver's IntegrityError, Django's.
    with pytest.raises(IntegrityError):
        ops.execute([ops.WriteOp(inserts=[reasoning, event(1, "RUN")])], connection)
    assert not TraceEvent.objects.filter(run_id=run.run_id, sequence_no__gte=900).exists()
    assert not AgentReasoningAudit.objects.filter(run_id=run.run_id, step_index=99).exists()
    assert connection.is_usable() and not connection.in_atomic_block

    seen.clear()
    with CaptureQueriesContext(connection) as captured:
        ops.execute([ops.WriteOp(inserts=[reasoning, event(902, "RUN")])], connection)
    assert not seen
    assert any("BEGIN NOT ATOMIC" in q["sql"] for q in captured.captured_queries)
    assert TraceEvent.objects.filter(run_id=run.run_id, sequence_no=902).exists()
