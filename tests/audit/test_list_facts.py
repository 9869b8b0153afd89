"""The runs' stored list facts (`audit.read.list_facts`): written with the terminal row and by what changes
them later, always equal to the rule recomputed from the stored rows; `verify_audit` reports a disagreement
(and `--refresh-facts` rewrites it); the sessions' `run_count` and `last_run_at` follow their runs."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from agent.runtime.sweeper import sweep_expired_runs
from audit.models import AgentStep, ToolInvocation
from audit.read.list_facts import FACT_FIELDS, annotate_recomputed, disagreements
from audit.verify.runs import verify_run
from audit.write import DeclaredToolCall, RunRecorder
from audit.write.reasoning_changes import purge_reasoning
from diagnosis import services
from diagnosis.models import ChatSession, DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.capture import build_capture
from tests.factories import make_recorded_run, record_full_run, usage

pytestmark = pytest.mark.django_db


def _stored_and_recomputed(run: DiagnosisRun) -> tuple[dict, dict]:
    row = annotate_recomputed(DiagnosisRun.objects.filter(pk=run.pk)).get()
    stored = {name: getattr(row, name) for name in FACT_FIELDS}
    recomputed = {name: getattr(row, f"recomputed_{name}") for name in FACT_FIELDS}
    recomputed["audit_complete"] = bool(recomputed["audit_complete"])
    return stored, recomputed


def _assert_agree(run: DiagnosisRun) -> dict:
    stored, recomputed = _stored_and_recomputed(run)
    assert stored == recomputed
    return stored


def _partial(run: DiagnosisRun) -> RunRecorder:
    """A run that started, routed and declared one tool call, which is RUNNING."""
    rec = RunRecorder.for_run(run)
    rec.run_started(release_mode="verified")
    rec.routing_attempt(attempt=1, model="router-m", usage=usage(10, 2), ok=True, intent="DIAGNOSIS")
    call = DeclaredToolCall(tool_call_id="c1", name="lookup_knowledge", arguments='{"query": "q"}')
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=usage(80, 6),
        reasoning=build_capture(reasoning=None, text="", tool_calls=[call.plan()]),
        tool_calls=[call],
        finish_reason="tool_calls",
    )
    rec.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"query": "q"})
    return rec


def test_a_published_run_stores_its_facts_with_the_terminal_row(user):
    run = make_recorded_run(user, tools=2)
    facts = _assert_agree(run)
    assert facts["audit_complete"] is True
    assert facts["persisted_steps"] == AgentStep.objects.filter(run_id=run.run_id).count() == 2
    assert facts["persisted_tools"] == ToolInvocation.objects.filter(run_id=run.run_id).count() == 2
    assert facts["persisted_events"] == run.expected_events


def test_a_run_not_ended_has_no_facts_yet(run):
    _partial(run)
    run.refresh_from_db()
    assert (run.audit_complete, run.persisted_events) == (False, 0)
    run = annotate_recomputed(DiagnosisRun.objects.filter(pk=run.pk)).get()
    assert disagreements(run) == []


def test_a_blocked_run(user):
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="q")
    rec = _partial(run)
    rec.tool_finished(tool_call_id="c1", status="SUCCEEDED", output="{}")
    rec.release(decision=ReleaseDecision.BLOCKED, reason="unsupported claims")
    rec.finish(status=RunStatus.SUCCESS, content="")
    run.refresh_from_db()
    assert run.release_decision == ReleaseDecision.BLOCKED
    assert _assert_agree(run)["audit_complete"] is True


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.CANCELLED])
def test_a_failed_or_cancelled_run(run, status):
    rec = _partial(run)
    if status == RunStatus.CANCELLED:
        rec.run_cancelled(reason="user asked")
    rec.finish(status=status, error_code="X" if status == RunStatus.FAILED else "")
    run.refresh_from_db()
    assert run.status == status
    facts = _assert_agree(run)
    # The dangling tool was closed by the finish, so the audit is complete.
    assert facts["audit_complete"] is True and facts["persisted_tools"] == 1


def test_a_run_whose_lease_was_lost(run):
    _partial(run)
    DiagnosisRun.objects.filter(pk=run.pk).update(
        lease_owner="dead:1:x", lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert sweep_expired_runs() == [run.run_id]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert _assert_agree(run)["audit_complete"] is True


def test_a_reasoning_purge(user):
    run = make_recorded_run(user)
    assert purge_reasoning(run_id=run.run_id) == 2
    assert _assert_agree(run)["audit_complete"] is True


def test_an_injected_audit_write_failure_after_the_end(user):
    run = make_recorded_run(user, tools=1)
    assert _assert_agree(run)["audit_complete"] is True
    # A late write that fails (here, injected by the recorder's own accounting of a lost decision)
    # turns the stored flag false at once.
    rec = RunRecorder.for_run(run)  # (a finished chain is never resumed: `ChainFinished`)
    rec.chain.failed("late_write", RuntimeError("injected"))
    run.refresh_from_db()
    assert run.audit_write_failures == 1
    assert _assert_agree(run)["audit_complete"] is False


def test_a_failed_write_during_the_run_is_in_the_terminal_facts(user):
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="q")
    rec = RunRecorder.for_run(run)
    rec.chain.failed("lost_decision", RuntimeError("injected"))
    record_full_run(run, recorder=rec)
    run.refresh_from_db()
    assert run.audit_write_failures == 1
    assert _assert_agree(run)["audit_complete"] is False


def test_verify_audit_reports_a_forced_disagreement_and_refreshes_it(user):
    run = make_recorded_run(user)
    DiagnosisRun.objects.filter(pk=run.pk).update(audit_complete=False, persisted_tools=7)
    result = verify_run(run.run_id)
    assert not result.ok
    assert "stored audit_complete is False, recomputed True" in result.facts
    assert "stored persisted_tools is 7, recomputed 2" in result.facts

    out = io.StringIO()
    with pytest.raises(CommandError, match="failed verification"):
        call_command("verify_audit", "--refresh-facts", stdout=out)
    text = out.getvalue()
    assert f"run={run.run_id} FACTS stored audit_complete is False, recomputed True" in text
    assert "rewrote the stored list facts of 1 run(s)" in text
    run.refresh_from_db()
    assert run.audit_complete is True and run.persisted_tools == 2
    assert verify_run(run.run_id).facts == []


def test_sessions_count_their_runs_and_the_purge_recounts(user):
    session = services.create_session(owner=user)
    assert (session.run_count, session.last_run_at) == (0, None)
    first = services.create_run(session=session, query="a")
    second = services.create_run(session=session, query="b")
    session.refresh_from_db()
    assert session.run_count == 2 and session.last_run_at == second.created_at
    DiagnosisRun.objects.filter(pk=second.pk).delete()
    assert services.refresh_session_facts(session_ids=[session.session_id]) == 1
    session.refresh_from_db()
    assert session.run_count == 1 and session.last_run_at == first.created_at
    assert ChatSession.objects.get(pk=session.pk).run_count == 1


def test_the_backfill_migration_writes_the_facts_of_existing_runs(user):
    import importlib

    from django.apps import apps

    backfill = importlib.import_module("diagnosis.migrations.0009_list_facts").backfill
    complete = make_recorded_run(user, tools=1)
    failed = make_recorded_run(user)
    DiagnosisRun.objects.filter(pk=failed.pk).update(audit_write_failures=1)
    # As before the migration: no facts stored, sessions uncounted.
    DiagnosisRun.objects.update(
        audit_complete=False, persisted_events=0, persisted_steps=0, persisted_tools=0
    )
    ChatSession.objects.update(run_count=0, last_run_at=None)
    backfill(apps, None)
    assert _assert_agree(complete)["audit_complete"] is True
    assert _assert_agree(failed)["audit_complete"] is False
    session = ChatSession.objects.get(session_id=complete.session_id)
    assert session.run_count == 1 and session.last_run_at == complete.created_at


def test_a_late_write_after_the_end_rewrites_the_facts_in_its_transaction(user):
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="q")
    rec = record_full_run(run, tools=1)
    run.refresh_from_db()
    assert _assert_agree(run)["audit_complete"] is True
    # A decision recorded after RUN_FINISHED: one event more than the chain's finish expected.
    rec.evidence_guard(retry=False, passed=True, cited=[])
    run.refresh_from_db()
    facts = _assert_agree(run)
    assert facts["audit_complete"] is False and facts["persisted_events"] == run.expected_events + 1
