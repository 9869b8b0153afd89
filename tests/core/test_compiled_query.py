"""`core.compiled.CompiledQuery`: the rows of a query compiled once equal the ORM's for every call."""

import datetime as dt

import pytest
from django.db.models import OuterRef, Subquery

from audit.models import ToolInvocation
from core.compiled import CompiledQuery
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunFeedback
from tests.factories import record_full_run

pytestmark = pytest.mark.django_db


def test_rows_equal_values_list_for_each_run_and_queries_are_counted(
    run, chat_session, django_assert_num_queries
):
    other = services.create_run(session=chat_session, query="another")
    record_full_run(run, tools=3)
    record_full_run(other, tools=1)
    tools = CompiledQuery(
        lambda run_id: ToolInvocation.objects.filter(run_id=run_id).order_by("id"), run_id=str
    )
    names = tools.names()
    for r in (run, other, run):
        expected = list(ToolInvocation.objects.filter(run_id=r.run_id).order_by("id").values_list(*names))
        with django_assert_num_queries(1):
            got = [tuple(row) for row in tools.rows(run_id=r.run_id)]
        assert got == expected and got  # datetimes aware, JSON decoded, booleans as bool, as the ORM gives
    assert tools.rows(run_id="no-such-run") == []


def test_a_parameter_used_in_several_subqueries_and_an_int_parameter(user, run):
    services.submit_feedback(run=run, user=user, rating="up", comment="ok")

    def build(run_id, viewer):
        mine = RunFeedback.objects.filter(run_id=OuterRef("run_id"), user_id=viewer)
        return (
            DiagnosisRun.objects.filter(run_id=run_id)
            .annotate(
                rating=Subquery(mine.values("rating")[:1]),
                comment=Subquery(mine.values("comment")[:1]),
            )
            .values_list("run_id", "rating", "comment")
        )

    query = CompiledQuery(build, run_id=str, viewer=int)
    assert [tuple(r) for r in query.rows(run_id=run.run_id, viewer=user.pk)] == [(run.run_id, "up", "ok")]
    assert [tuple(r) for r in query.rows(run_id=run.run_id, viewer=user.pk + 1)] == [(run.run_id, None, None)]


def test_a_parameter_missing_from_the_sql_is_refused():
    query = CompiledQuery(lambda run_id: DiagnosisRun.objects.filter(run_id="fixed"), run_id=str)
    with pytest.raises(ValueError, match="does not appear"):
        query.rows(run_id="x")


@pytest.mark.parametrize("text", ['{"a": [1, 2.5, "é"]}', ' {"a": 1}', "[1, 2] ", '"x"', "null", "1e3", "{}"])
def test_json_loads_is_json_loads(text):
    import json

    from core.compiled import json_loads

    assert json_loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ['{"a": 1}x', "", "{", "[1,]"])
def test_json_loads_refuses_what_json_loads_refuses(text):
    import json

    from core.compiled import json_loads

    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        json_loads(text)


def test_date_times_read_aware_by_the_driver_equal_djangos_and_the_converter_is_restored(run):
    """On MySQL, after the first result showed that every DATETIME column is one Django makes aware in
    UTC, the driver reads them aware at once (`core.mysql_conversions.aware_utc`): the same values,
    NULL included, and the connection's own converter in place after each call."""
    from django.db import connection

    record_full_run(run, tools=2)
    ToolInvocation.objects.filter(run_id=run.run_id).update(finished_at=None)
    tools = CompiledQuery(
        lambda run_id: ToolInvocation.objects.filter(run_id=run_id).order_by("id"), run_id=str
    )
    names = tools.names()
    expected = list(ToolInvocation.objects.filter(run_id=run.run_id).order_by("id").values_list(*names))
    for _ in range(3):
        assert [tuple(row) for row in tools.rows(run_id=run.run_id)] == expected
    compiled = tools._compiled[connection.alias]
    if connection.vendor != "mysql":
        assert compiled[6] is False  # decided: converted by Django's converters as before
        return
    from MySQLdb.constants import FIELD_TYPE

    from core.mysql_conversions import datetime_or_none

    assert compiled[6] is True and len(compiled[5]) == 4  # started_at, finished_at, created_at, updated_at
    assert connection.connection.converter[FIELD_TYPE.DATETIME] is datetime_or_none
    got = tools.rows(run_id=run.run_id)
    assert all(row[names.index("created_at")].tzinfo is dt.UTC for row in got)
    assert all(row[names.index("finished_at")] is None for row in got)


def test_a_date_time_column_without_djangos_conversion_keeps_the_driver_value(run):
    """A DATETIME column Django does not convert (an extra select) stays naive as the driver gives it:
    the query is then never read with the aware converter."""
    record_full_run(run, tools=1)

    def build(run_id):
        return (
            ToolInvocation.objects.filter(run_id=run_id)
            .extra(select={"raw_time": "tool_invocation.created_at"})
            .values_list("raw_time", "created_at")
        )

    query = CompiledQuery(build, run_id=str)
    expected = list(build(run.run_id))
    for _ in range(3):
        assert [tuple(r) for r in query.rows(run_id=run.run_id)] == expected
    from django.db import connection

    assert query._compiled[connection.alias][6] is False
