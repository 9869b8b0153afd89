"""`verify_audit` reads a chunk's runs and rows as attribute bags through queries compiled once per number
of ids (`audit.verify.chunk_reads`): every column holds what a model instance read through the ORM holds,
the recomputed list facts included, whatever the number of ids (padded to a power of two, split above
`MAX_IDS`), and nothing of another run is read."""

from __future__ import annotations

import pytest

from audit.models import AgentStep, RunReview, ToolInvocation
from audit.read.list_facts import annotate_recomputed
from audit.verify import chunk_reads
from audit.verify.chunk_reads import RowsOfRuns, RowsOfSessions, runs_in_range, runs_with_pks
from audit.write.reviews import record_review
from diagnosis.models import ChatSession, DiagnosisRun
from tests.factories import make_recorded_run


def _columns(model, row) -> dict:
    return {f.attname: getattr(row, f.attname) for f in model._meta.concrete_fields} | {"pk": row.pk}


def _annotated(run) -> dict:
    names = [n for n in vars(run) if n.startswith("recomputed_")]
    return _columns(DiagnosisRun, run) | {n: getattr(run, n) for n in names}


@pytest.fixture
def runs(user, auditor):
    made = [make_recorded_run(user) for _ in range(3)]
    record_review(run=made[1], user=auditor, verdict="correct", note="checked")
    return made


@pytest.mark.django_db
def test_run_rows_hold_every_column_and_fact_of_the_orm_read(runs):
    orm = list(annotate_recomputed(DiagnosisRun.objects.all()).order_by("pk"))
    assert any(n.startswith("recomputed_") for n in vars(orm[0]))
    pks = [r.pk for r in orm]
    for read in (runs_in_range(pks[0], pks[-1]), runs_with_pks(list(reversed(pks)))):
        assert [vars(r) | {} for r in read] == [_annotated(r) for r in orm]
        assert [r.is_terminal for r in read] == [r.is_terminal for r in orm] == [True] * 3
    assert [r.pk for r in runs_with_pks(pks[1:2])] == pks[1:2]
    assert runs_with_pks([]) == [] and runs_in_range(pks[-1] + 1, pks[-1] + 9) == []


@pytest.mark.django_db
def test_rows_of_runs_hold_every_column_by_run_in_order(runs, monkeypatch):
    ids = [r.run_id for r in runs]
    for model, order in (
        (AgentStep, ("run_id", "step_index", "id")),
        (ToolInvocation, ("run_id", "id")),
        (RunReview, ("run_id", "sequence_no")),
    ):
        expected: dict = {}
        for row in model.objects.filter(run_id__in=ids).order_by(*order):
            expected.setdefault(row.run_id, []).append(_columns(model, row))
        assert expected, model
        reader = RowsOfRuns(model, order)
        # Three ids (padded to four), one run alone, and ids split over queries of at most two.
        for subset in (ids, ids[1:2]):
            got = {k: [vars(b) for b in v] for k, v in reader(subset).items()}
            assert got == {k: v for k, v in expected.items() if k in subset}
        monkeypatch.setattr(chunk_reads, "MAX_IDS", 2)
        assert {k: [vars(b) for b in v] for k, v in reader(ids).items()} == expected
        monkeypatch.setattr(chunk_reads, "MAX_IDS", 512)
    sessions = RowsOfSessions()({r.session_id for r in runs} | {"no-such-session"})
    assert {k: vars(v) for k, v in sessions.items()} == {
        s.session_id: _columns(ChatSession, s) for s in ChatSession.objects.all()
    }


@pytest.mark.django_db
def test_timelines_of_a_chunk_are_the_orm_read_of_each_run(runs, monkeypatch):
    """`audit.read.trace.timelines_of` (compiled per number of ids) reads what the ORM's values read,
    converted alike (aware date-times, the details text as stored, decoded), for any split of the ids."""
    from django.db.models import TextField
    from django.db.models.functions import Cast

    from audit.models import TraceEvent
    from audit.read.trace import _EVENT_VALUES, StoredEvent, timeline_of, timelines_of

    ids = [r.run_id for r in runs]
    names = [*_EVENT_VALUES, "details_text", "details"]
    expected: dict = {}
    orm = TraceEvent.objects.filter(run_id__in=ids).order_by("run_id", "sequence_no")
    for row in orm.annotate(details_text=Cast("details", output_field=TextField())).values_list(
        *_EVENT_VALUES, "details_text"
    ):
        event = StoredEvent(*row)
        expected.setdefault(event.run_id, []).append(
            [(getattr(event, n), type(getattr(event, n))) for n in names]
        )
    assert expected and all(e[10][0].tzinfo is not None for v in expected.values() for e in v)

    def read(subset):
        return {
            k: [[(getattr(e, n), type(getattr(e, n))) for n in names] for e in v]
            for k, v in timelines_of(subset).items()
        }

    for subset in (ids, ids[1:2], [*ids, "no-such-run"]):
        assert read(subset) == {k: v for k, v in expected.items() if k in subset}
    monkeypatch.setattr(chunk_reads, "MAX_IDS", 2)
    assert read(ids) == expected
    monkeypatch.setattr(chunk_reads, "MAX_IDS", 512)
    one = [[(getattr(e, n), type(getattr(e, n))) for n in names] for e in timeline_of(run_id=ids[0])]
    assert one == expected[ids[0]]
