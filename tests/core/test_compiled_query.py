"""`core.compiled.CompiledQuery`: the rows of a query compiled once equal the ORM's for every call."""

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
