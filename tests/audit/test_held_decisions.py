"""Held decisions (`RunRecorder.hold`): decisions that no effect of the run follows before its next record
are chained at once and committed with that record in one transaction; the records are the same as
when each is written on its own (every row chained in order, sequences gapless, counts, fence), and a
combined write that fails costs exactly the decisions that fail on their own.

`transaction=True`: the writes take the paths they take in production (autocommit, the MariaDB compound
statement)."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from audit.models import AgentStep, EventType, ToolInvocation, TraceEvent
from audit.verify.hash_chain import verify_chain
from audit.verify.runs import verify_run
from audit.write import DeclaredToolCall, RunRecorder, ToolCallNotDeclared
from diagnosis.models import DiagnosisRun, RunStatus
from reasoning.capture import build_capture
from tests.factories import usage

pytestmark = pytest.mark.django_db(transaction=True)


def _types(run_id):
    return list(
        TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no").values_list("event_type", flat=True)
    )


def _counted(rec):
    """Count the transactions the recorder submits (one per call of its write path)."""
    submitted = []
    inner = rec.chain._submit

    def submit(op):
        submitted.append(op)
        inner(op)

    rec.chain._submit = submit
    return submitted


def _hold_plan_and_guard(rec):
    rec.hold(rec.routing_decision, intent="DIAGNOSIS", confidence=None, reason="r", fallback=False)
    rec.hold(
        rec.model_step,
        step_index=1,
        agent_name="planner",
        model="m",
        usage=usage(10, 5),
        reasoning=build_capture(reasoning="because", text="plan"),
    )
    rec.hold(rec.plan_decision, agent_name="planner", status="ACCEPTED", steps=[{"check": "c"}], step_index=1)


class FailInserts:
    """Execute wrapper: an INSERT into `table` (timeline events by default) whose parameters hold every
    one of `values` raises."""

    def __init__(self, *values, table="diagnosis_trace_event"):
        self.types = values
        self.table = table
        self.fired = 0

    def __call__(self, execute, sql, params, many, context):
        values = list(params or ())
        insert = sql.lstrip().upper().startswith("INSERT") and self.table in sql
        if insert and all(t in values for t in self.types):
            self.fired += 1
            raise RuntimeError("injected")
        return execute(sql, params, many, context)


def test_held_decisions_commit_with_the_next_write_in_one_transaction(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    submitted = _counted(rec)
    _hold_plan_and_guard(rec)
    # Chained and counted, not written yet.
    assert submitted == [] and rec.holds()
    assert _types(run.run_id) == ["RUN_STARTED"]
    assert not AgentStep.objects.filter(run_id=run.run_id).exists()
    rec.model_call_started()
    assert len(submitted) == 1 and not rec.holds()
    assert _types(run.run_id) == [
        "RUN_STARTED",
        "ROUTING_DECISION",
        "AGENT_MODEL_STEP",
        "MODEL_TOKEN_USAGE",
        "PLAN_DECISION",
    ]
    run.refresh_from_db()
    # The run fields of every decision of the transaction (the held routing's intent, the call count).
    assert run.intent == "DIAGNOSIS" and run.model_calls == 1
    assert run.expected_events == 5 == rec.expected_events and run.expected_steps == 1
    assert rec.tools.step_ids[("planner", 1)] == AgentStep.objects.get(run_id=run.run_id).id
    rec.release(decision="PUBLISHED", reason="ok")
    rec.finish(status=RunStatus.SUCCESS, content="answer")
    result = verify_run(run.run_id)
    assert result.ok, (result.invalid, result.incomplete)


def test_finish_writes_run_finished_with_the_terminal_row(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    rec.release(decision="PUBLISHED", reason="ok")
    submitted = _counted(rec)
    seq = rec.finish(status=RunStatus.SUCCESS, content="answer")
    assert len(submitted) == 1
    assert TraceEvent.objects.get(run_id=run.run_id, sequence_no=seq).event_type == EventType.RUN_FINISHED
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS and run.audit_complete
    assert verify_run(run.run_id).ok


def test_a_failed_combined_write_writes_each_decision_on_its_own(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    _hold_plan_and_guard(rec)
    # Only the statement holding several decisions' events fails: alone, each commits.
    fail = FailInserts("ROUTING_DECISION", "PLAN_DECISION")
    with connection.execute_wrapper(fail):
        rec.model_call_started()
    assert fail.fired == 1
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    assert [e.sequence_no for e in events] == [1, 2, 3, 4, 5]
    assert verify_chain(events).valid
    run.refresh_from_db()
    assert run.audit_write_failures == 0 == rec.audit_write_failures
    assert run.intent == "DIAGNOSIS" and run.model_calls == 1
    assert AgentStep.objects.filter(run_id=run.run_id).count() == 1


def test_a_decision_that_fails_on_its_own_is_the_only_one_lost(run, caplog):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    _hold_plan_and_guard(rec)
    with connection.execute_wrapper(FailInserts("PLAN_DECISION")):
        rec.model_call_started()
    rec.finish(status=RunStatus.SUCCESS, content="")
    run.refresh_from_db()
    assert run.audit_write_failures == 1 == rec.audit_write_failures
    assert f"audit write failed run={run.run_id} op=plan_decision error=RuntimeError" in caplog.text
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    assert [e.event_type for e in events] == [
        "RUN_STARTED",
        "ROUTING_DECISION",
        "AGENT_MODEL_STEP",
        "MODEL_TOKEN_USAGE",
        "RUN_FINISHED",
    ]
    assert [e.sequence_no for e in events] == [1, 2, 3, 4, 5] and verify_chain(events).valid
    # The lost decision shows: expected one event more than stored.
    assert run.expected_events == 6 and run.model_calls == 1 and not run.audit_complete


def test_a_fenced_combined_write_lands_nothing_and_counts_each_decision(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    _hold_plan_and_guard(rec)
    # Another process claimed the run since.
    DiagnosisRun.objects.filter(run_id=run.run_id).update(lease_epoch=run.lease_epoch + 1)
    rec.model_call_started()
    run.refresh_from_db()
    assert rec.fenced and rec.fenced_writes == 4 == run.fenced_writes
    assert run.audit_write_failures == 0
    assert _types(run.run_id) == ["RUN_STARTED"] and not AgentStep.objects.filter(run_id=run.run_id).exists()
    assert not rec.holds()


def test_only_decisions_whose_callers_need_no_outcome_are_held(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    with pytest.raises(ValueError):
        rec.hold(rec.tool_started, tool_call_id="c1", tool_name="t", input_params={})
    with pytest.raises(ValueError):
        rec.hold(rec.release, decision="PUBLISHED", reason="the self-evaluation reads it")
    # A step that declares tool calls is written at once: its calls' rows name its row id.
    rec.hold(
        rec.model_step,
        step_index=1,
        agent_name="executor",
        model="m",
        usage=usage(1, 1),
        reasoning=build_capture(reasoning=None, text=""),
        tool_calls=[DeclaredToolCall(tool_call_id="c1", name="t", arguments="{}")],
    )
    assert not rec.holds()
    step = AgentStep.objects.get(run_id=run.run_id)
    rec.tool_started(tool_call_id="c1", tool_name="t", input_params={})
    assert rec.tools.step_ids[("executor", 1)] == step.id


def _two_calls(rec):
    rec.model_step(
        step_index=1,
        agent_name="executor",
        model="m",
        usage=usage(1, 1),
        reasoning=build_capture(reasoning=None, text=""),
        tool_calls=[
            DeclaredToolCall(tool_call_id="c1", name="t", arguments="{}"),
            DeclaredToolCall(tool_call_id="c2", name="t", arguments="{}"),
        ],
    )


@pytest.mark.parametrize("combined_fails", [False, True])
def test_tool_starts_written_together_return_what_each_returns_alone(run, combined_fails):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    _two_calls(rec)
    submitted = _counted(rec)
    fail = FailInserts("c1", "c2", table="tool_invocation" if combined_fails else "never")
    with connection.execute_wrapper(fail):
        results = rec.record_together(
            [
                (rec.tool_started, {"tool_call_id": "c1", "tool_name": "t", "input_params": {"q": 1}}),
                (rec.tool_started, {"tool_call_id": "undeclared", "tool_name": "t", "input_params": {}}),
                (rec.tool_started, {"tool_call_id": "c2", "tool_name": "t", "input_params": {"q": 2}}),
            ]
        )
    # One transaction (then, when it failed, each start on its own).
    assert len(submitted) == (4 if combined_fails else 1) and fail.fired == int(combined_fails)
    assert isinstance(results[1], ToolCallNotDeclared)
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    by_seq = {e.sequence_no: e for e in events}
    assert by_seq[results[0]].details["toolCallId"] == "c1" and by_seq[results[0]].status == "RUNNING"
    assert by_seq[results[2]].details["toolCallId"] == "c2" and by_seq[results[2]].status == "RUNNING"
    assert [e.details.get("toolCallId") for e in events[-3:]] == ["c1", "undeclared", "c2"]
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1)) and verify_chain(events).valid
    assert ToolInvocation.objects.filter(run_id=run.run_id, status="RUNNING").count() == 2
    assert rec.audit_write_failures == 0
    assert rec.tools.calls["c1"].started_monotonic is not None


def test_a_combined_write_that_committed_but_lost_its_outcome_is_not_written_twice(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    _hold_plan_and_guard(rec)
    inner = rec.chain._submit
    lost = []

    def submit(op):
        inner(op)
        if not lost:  # committed, then the connection went away before the answer arrived
            lost.append(op)
            raise OperationalError(2013, "Lost connection to server during query")

    rec.chain._submit = submit
    rec.model_call_started()
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    assert [e.event_type for e in events] == [
        "RUN_STARTED",
        "ROUTING_DECISION",
        "AGENT_MODEL_STEP",
        "MODEL_TOKEN_USAGE",
        "PLAN_DECISION",
    ]
    assert verify_chain(events).valid and rec.audit_write_failures == 0
    rec.release(decision="PUBLISHED", reason="ok")
    assert rec.finish(status=RunStatus.SUCCESS, content="answer") == 7
    assert verify_run(run.run_id).ok
