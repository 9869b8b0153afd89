"""The audit-complete rule has two implementations that must agree: the run list's stored fact, decided in
SQL by `audit.read.list_facts` (here recomputed by `annotate_recomputed`, the expressions the recorder stores)
and the trace summary (`audit.read.summarize`, through
`get_trace`). Over a matrix of runs — every status, each audit table with a row missing, an extra row,
or the count it expects, a failed audit write, a tool left RUNNING, provider-side notes — both give the
same answer (each state rebound into the chain as if recorded). The checks only the trace can make (the
hash chain, rows under another session, each row against its digest in the chain) are pinned
separately, as the documented difference."""

from __future__ import annotations

import itertools

import pytest

from audit.models import AgentStep, EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.read import get_trace
from audit.read.list_facts import annotate_recomputed
from audit.verify import row_digests
from audit.verify.hash_chain import GENESIS_HASH, link_hash
from core import writeauth
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
    annotated = annotate_recomputed(DiagnosisRun.objects.filter(pk=run.pk)).get()
    run.refresh_from_db()
    return annotated.recomputed_audit_complete, get_trace(run=run).summary.audit_complete


def _as_recorded(run: DiagnosisRun) -> None:
    """Rebind the run's rows as they now are into its chain (digests, expected counts from the run's
    columns, every hash recomputed and tagged with the write key), as if the recorder had recorded this
    state: the row digests, which
    only the trace can check, then agree, and the two rules are compared on what both decide."""
    run.refresh_from_db()
    tools = {t.tool_call_id: t for t in ToolInvocation.objects.filter(run_id=run.run_id)}
    prev = GENESIS_HASH
    for event in TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"):
        details = dict(event.details)
        if event.event_type == EventType.TOOL_INVOCATION and details.get("rowDigest"):
            details["rowDigest"] = row_digests.TOOL.digest_of(tools[details["toolCallId"]])
        if event.event_type == EventType.RUN_FINISHED:
            details["runDigest"] = row_digests.RUN.digest_of(run)
            details["expected"] = {
                **details["expected"],
                "events": run.expected_events,
                "steps": run.expected_steps,
                "tools": run.expected_tools,
            }
        event.details, event.prev_hash = details, prev
        event.hash = link_hash(event)
        event.tag = writeauth.tag(writeauth.RUN, event.hash)  # as the recorder would have tagged it
        event.save(update_fields=["details", "prev_hash", "hash", "tag"])
        prev = event.hash


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
        _as_recorded(run)
        sql, summary = _both(run)
        assert sql == summary, (status, change, failures, tool_running)
        outcomes.add(summary)
    assert outcomes == {True, False}  # the matrix holds complete and incomplete runs


def test_provider_notes_leave_both_complete(user):
    run = make_recorded_run(user)
    DiagnosisRun.objects.filter(pk=run.pk).update(usage_unavailable_calls=1, tokens_reconciled=False)
    _as_recorded(run)
    assert _both(run) == (True, True)


def test_only_the_trace_sees_a_broken_chain_rows_of_another_session_or_an_altered_row(user):
    broken = make_recorded_run(user)
    TraceEvent.objects.filter(run_id=broken.run_id, sequence_no=2).update(hash="0" * 64)
    assert _both(broken) == (True, False)

    moved = make_recorded_run(user)
    elsewhere = services.create_session(owner=user)
    AgentStep.objects.filter(run_id=moved.run_id, step_index=1).update(session_id=elsewhere.session_id)
    assert _both(moved) == (True, False)

    altered = make_recorded_run(user)
    DiagnosisRun.objects.filter(pk=altered.pk).update(content="not what was released")
    assert _both(altered) == (True, False)


def test_a_purged_run_is_complete_for_both(user):
    from audit.write.reasoning_changes import purge_reasoning

    run = make_recorded_run(user)
    assert purge_reasoning(run_id=run.run_id) == 2
    assert _both(run) == (True, True)
