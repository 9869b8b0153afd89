"""The runtime's per-run reads compiled once (`core.compiled`) answer what their ORM forms answered."""

import datetime as dt

import pytest

from agent.runtime.pipeline import PREVIOUS_TURNS, previous_turns
from diagnosis import services
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus

pytestmark = pytest.mark.django_db


def _orm_previous_turns(run: DiagnosisRun) -> list:
    """`previous_turns` as it was written with the ORM (the run's creation time passed as `before`)."""
    rows = list(
        DiagnosisRun.objects.filter(
            session_id=run.session_id,
            status=RunStatus.SUCCESS,
            release_decision=ReleaseDecision.PUBLISHED,
            created_at__lte=run.created_at,
        )
        .exclude(run_id=run.run_id)
        .order_by("-created_at", "-id")
        .values_list("query", "content")[:PREVIOUS_TURNS]
    )
    return rows[::-1]


def test_previous_turns_are_the_orm_querys_for_every_run_of_a_session(chat_session, user):
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    runs = [services.create_run(session=chat_session, query=f"question {i}") for i in range(7)]
    # Creation times with a tie (runs 3 and 4), published and blocked runs, and one still pending.
    for i, run in enumerate(runs):
        created = base + dt.timedelta(seconds=min(i, 3) if i < 5 else i)
        status, release = (RunStatus.SUCCESS, ReleaseDecision.PUBLISHED)
        if i == 2:
            release = ReleaseDecision.BLOCKED
        if i == 6:
            status, release = RunStatus.PENDING, None
        DiagnosisRun.objects.filter(pk=run.pk).update(
            created_at=created, status=status, release_decision=release, content=f"answer {i}"
        )
    other = services.create_run(session=services.create_session(owner=user), query="elsewhere")
    DiagnosisRun.objects.filter(pk=other.pk).update(
        created_at=base, status=RunStatus.SUCCESS, release_decision=ReleaseDecision.PUBLISHED
    )
    seen = []
    for run in DiagnosisRun.objects.filter(session=chat_session):
        got = previous_turns(session_id=run.session_id, run_id=run.run_id)
        assert got == _orm_previous_turns(run)
        seen.append(len(got))
    assert max(seen) == PREVIOUS_TURNS and 0 in seen  # the bound, and a first turn, were both met


def test_run_by_id_is_the_orm_row_with_every_column(chat_session):
    run = services.create_run(
        session=chat_session, query="q", redaction={"counts": {"aws-access-key": 1}, "items": []}
    )
    DiagnosisRun.objects.filter(pk=run.pk).update(lease_owner="me", lease_epoch=3)
    expected = DiagnosisRun.objects.filter(run_id=run.run_id).first()
    got = services.run_by_id(run.run_id)
    for field in DiagnosisRun._meta.concrete_fields:
        assert getattr(got, field.attname) == getattr(expected, field.attname), field.attname
    assert got.created_at.tzinfo is not None and got.redaction == expected.redaction
    assert got._state.adding is False and got._state.db == expected._state.db
    assert services.created_by_the_service(got)
    assert services.run_by_id("run_missing") is None
