"""A follower's catch-up reads (`audit.read.chat`) go through queries compiled once: they return what the
ORM's reads return (every event after any sequence number, the run's outcome columns as a model instance
with the rest deferred), in two queries, and an unknown run is still `DoesNotExist`."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent.runtime.events import CHAT_TIMELINE_TYPES
from audit.models import EventType, TraceEvent
from audit.read import chat_timeline, finished_by
from audit.read.chat import _RUN_OUTCOME_FIELDS
from diagnosis.models import DiagnosisRun
from tests.factories import make_recorded_run


def _orm_timeline(run_id: str, after: int) -> list[tuple]:
    return list(
        TraceEvent.objects.filter(
            run_id=run_id, sequence_no__gt=after, event_type__in=list(CHAT_TIMELINE_TYPES)
        )
        .order_by("sequence_no")
        .values_list("sequence_no", "event_type", "status", "details", "created_at")
    )


@pytest.mark.django_db
def test_the_compiled_reads_return_what_the_orm_reads(user):
    run = make_recorded_run(user)
    make_recorded_run(user)  # another run's events are never read
    top = TraceEvent.objects.filter(run_id=run.run_id).count()
    assert top > 5
    orm_run = DiagnosisRun.objects.only(*_RUN_OUTCOME_FIELDS).get(run_id=run.run_id)
    for after in (0, 1, top // 2, top - 1, top, top + 5):
        with CaptureQueriesContext(connection) as queries:
            rows, read = chat_timeline(run_id=run.run_id, after=after, event_types=CHAT_TIMELINE_TYPES)
        assert len(queries) == 2
        expected = _orm_timeline(run.run_id, after)
        assert [tuple(getattr(r, n) for n in r.__slots__) for r in rows] == expected
        assert [type(r.created_at) for r in rows] == [type(e[4]) for e in expected]
        assert {f: getattr(read, f) for f in _RUN_OUTCOME_FIELDS} == {
            f: getattr(orm_run, f) for f in _RUN_OUTCOME_FIELDS
        }
        assert read.pk == orm_run.pk and read.get_deferred_fields() == orm_run.get_deferred_fields()
        assert read._state.db == orm_run._state.db
    assert _orm_timeline(run.run_id, 0)[-1][1] == EventType.RUN_FINISHED


@pytest.mark.django_db
def test_finished_by_and_an_unknown_run(user):
    run = make_recorded_run(user)
    finished = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_FINISHED).sequence_no
    assert finished_by(run_id=run.run_id, sequence_no=finished)
    assert not finished_by(run_id=run.run_id, sequence_no=finished - 1)
    assert not finished_by(run_id="no-such-run", sequence_no=finished)
    with pytest.raises(DiagnosisRun.DoesNotExist):
        chat_timeline(run_id="no-such-run", after=0, event_types=CHAT_TIMELINE_TYPES)
