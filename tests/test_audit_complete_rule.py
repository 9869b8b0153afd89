"""The audit-complete rule has two implementations that must agree: the run list's SQL annotation
(`audit.selectors.annotate_audit_completeness`) and the trace summary (`audit.selectors.summarize`, through
`get_trace`). Over a matrix of runs — every status, each audit table with a row missing, an extra row,
or the count it expects, a failed audit write, a tool left RUNNING, provider-side notes — both give the
same answer. The two checks only the trace can make (the hash chain, rows under another session) are
pinned separately, as the documented difference."""

from __future__ import annotations

import itertools

import pytest

from audit.models import AgentStep, ToolInvocation, ToolStatus, TraceEvent
from audit.selectors import annotate_audit_completeness, get_trace
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunStatus
from tests.factories import make_recorded_run

pytestmark = pytest.mark.django_db

STATUSES = [RunStatus.SUCCESS, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.RUNNING, RunStatus.PENDING]
COUNT_CHANGES = [
    None,
    ("expected_events", -1),
    ("expected_events", 1),
    ("expected_steps", 1),
    ("expected_tools", -1),
]


def _both(run: DiagnosisRun) -> tuple[bool, bool]:
    annotated = annotate_audit_completeness(DiagnosisRun.objects.filter(pk=run.pk)).get()
    run.refresh_from_db()
    return annotated.audit_complete, get_trace(run=run).summary.audit_complete


def test_sql_annotation_and_trace_summary_agree_over_a_matrix_of_runs(user):
    cases = list(itertools.product(STATUSES, COUNT_CHANGES, [0, 1], [False, True]))
    outcomes = set()
    for status, change, failures, tool_running in cases:
        run = make_recorded_run(user, tools=1)
        columns: dict = {"status": status, "audit_write_failures": failures}
        if change is not None:
            column, delta = change
            columns[column] = getattr(run, column) + delta
        DiagnosisRun.objects.filter(pk=run.pk).update(**columns)
        if tool_running:
            ToolInvocation.objects.filter(run_id=run.run_id).update(status=ToolStatus.RUNNING)
        sql, summary = _both(run)
        assert sql == summary, (status, change, failures, tool_running)
        outcomes.add(summary)
    assert outcomes == {True, False}  # the matrix holds complete and incomplete runs


def test_provider_notes_leave_both_complete(user):
    run = make_recorded_run(user)
    DiagnosisRun.objects.filter(pk=run.pk).update(usage_unavailable_calls=1, tokens_reconciled=False)
    assert _both(run) == (True, True)


def test_only_the_trace_sees_a_broken_chain_or_rows_of_another_session(user):
    broken = make_recorded_run(user)
    TraceEvent.objects.filter(run_id=broken.run_id, sequence_no=2).update(hash="0" * 64)
    assert _both(broken) == (True, False)

    moved = make_recorded_run(user)
    elsewhere = services.create_session(owner=user)
    AgentStep.objects.filter(run_id=moved.run_id, step_index=1).update(session_id=elsewhere.session_id)
    assert _both(moved) == (True, False)
