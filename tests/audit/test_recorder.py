"""The recorder: gapless sequences under concurrency, the hash chain, fail-open writes, tool lifecycle,
bounded payloads and the token ledger."""

import json
import threading

import pytest
from django.db import OperationalError, connection

from audit.models import AgentStep, EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.hash_chain import GENESIS_HASH, verify_chain
from audit.write import (
    DeclaredToolCall,
    RunRecorder,
    ToolCallNotDeclared,
    ToolCallRepeated,
    ToolLifecycleConflict,
    Usage,
)
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunStatus
from reasoning.capture import build_capture
from reasoning.models import AgentReasoningAudit
from tests.factories import record_full_run, usage


def _events(run_id):
    return list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))


# --------------------------------------------------------------------------------------------------
# Sequence numbers
# --------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_full_run_is_complete_and_chained(run):
    rec = record_full_run(run, tools=2)
    run.refresh_from_db()
    events = _events(run.run_id)
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))
    assert events[0].prev_hash == GENESIS_HASH
    assert verify_chain(events).valid
    assert run.expected_events == len(events) == rec.expected_events
    assert run.expected_steps == AgentStep.objects.filter(run_id=run.run_id).count() == 2
    assert run.expected_tools == ToolInvocation.objects.filter(run_id=run.run_id).count() == 2
    assert run.audit_write_failures == 0
    assert run.status == RunStatus.SUCCESS and run.release_decision == "PUBLISHED"
    assert run.intent == "DIAGNOSIS"
    types = [e.event_type for e in events]
    assert types[0] == EventType.RUN_STARTED and types[-1] == EventType.RUN_FINISHED
    assert types.count(EventType.MODEL_TOKEN_USAGE) == 4  # router, two agent steps, guard
    assert types.count(EventType.TOOL_INVOCATION) == 4  # start + terminal per tool


@pytest.mark.django_db(transaction=True)
def test_sequences_gapless_and_unique_across_concurrent_runs_and_threads(user):
    """Eight runs recorded at once from eight threads, and eight threads sharing one run."""
    session = services.create_session(owner=user)
    runs = [services.create_run(session=session, query=f"q{i}") for i in range(8)]
    shared = services.create_run(session=session, query="shared")
    shared_rec = RunRecorder.for_run(shared)
    errors = []
    barrier = threading.Barrier(16)

    def own_run(run):
        try:
            barrier.wait()
            rec = RunRecorder.for_run(run)
            for i in range(15):
                rec.release(decision="PUBLISHED", reason=f"r{i}")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    def shared_run(n):
        try:
            barrier.wait()
            for i in range(15):
                shared_rec.evidence_guard(retry=False, passed=True, cited=[f"t{n}-{i}"])
        except Exception as exc:  # pragma: no cover
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=own_run, args=(r,)) for r in runs]
    threads += [threading.Thread(target=shared_run, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for run in runs:
        seqs = [e.sequence_no for e in _events(run.run_id)]
        assert seqs == list(range(1, 16))
    shared_events = _events(shared.run_id)
    assert [e.sequence_no for e in shared_events] == list(range(1, 121))
    assert verify_chain(shared_events).valid
    assert shared_rec.audit_write_failures == 0


@pytest.mark.django_db
def test_writers_return_the_sequence_number_of_their_event(recorder, run):
    assert recorder.run_started() == 1
    _declare(recorder, "c1")  # step + usage events: 2, 3
    assert recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={}) == 4
    with pytest.raises(ToolCallRepeated):  # nothing written; the caller must not run the tool again
        recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={})
    assert recorder.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="x") == 5
    with connection.execute_wrapper(_FailInserts("diagnosis_trace_event", times=1)):
        assert recorder.release(decision="PUBLISHED", reason="ok") is None
    assert recorder.finish(status=RunStatus.SUCCESS, content="x") == 6


@pytest.mark.django_db
def test_resume_continues_the_chain(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    rec.routing_decision(intent="KNOWLEDGE", confidence=0.8, reason="r", fallback=False)
    other = RunRecorder.resume(run.run_id)
    other.release(decision="BLOCKED", reason="lease expired elsewhere")
    events = _events(run.run_id)
    assert [e.sequence_no for e in events] == [1, 2, 3]
    assert verify_chain(events).valid


@pytest.mark.django_db
def test_second_writer_collision_reloads_head(run):
    """Two recorders for one run (a sweeper racing the owner): the unique constraint catches the clash
    and the loser re-reads the chain head instead of forking the chain."""
    a = RunRecorder.for_run(run)
    b = RunRecorder.for_run(run)
    a.run_started()
    b.release(decision="BLOCKED", reason="swept")
    events = _events(run.run_id)
    assert [e.sequence_no for e in events] == [1, 2]
    assert verify_chain(events).valid
    assert b.audit_write_failures == 0


# --------------------------------------------------------------------------------------------------
# Hash chain
# --------------------------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize(
    "field,value",
    [
        ("summary", "edited summary"),
        ("status", "FAIL"),
        ("event_type", "RELEASE_DECISION"),
        ("details", {"injected": True}),
        ("session_id", "ses_other"),
    ],
)
def test_changing_any_stored_event_is_detected(run, field, value):
    record_full_run(run)
    events = _events(run.run_id)
    assert verify_chain(events).valid
    victim = events[len(events) // 2]
    TraceEvent.objects.filter(pk=victim.pk).update(**{field: value})
    verdict = verify_chain(_events(run.run_id))
    assert not verdict.valid
    assert any(f"sequence {victim.sequence_no}" in p for p in verdict.problems)


@pytest.mark.django_db
def test_deleted_and_recomputed_events_are_detected(run):
    record_full_run(run)
    events = _events(run.run_id)
    TraceEvent.objects.filter(pk=events[3].pk).delete()
    verdict = verify_chain(_events(run.run_id))
    assert not verdict.valid and verdict.missing_sequences == [4]

    # A forger who recomputes the edited event's own hash still breaks the next link.
    from audit.verify.hash_chain import link_hash

    e = _events(run.run_id)[5]
    e.summary = "forged"
    e.hash = link_hash(e)
    e.save()
    problems = verify_chain(_events(run.run_id)).problems
    assert any(f"sequence {e.sequence_no + 1}: prev_hash" in p for p in problems)


# --------------------------------------------------------------------------------------------------
# Fail-open
# --------------------------------------------------------------------------------------------------
class _FailInserts:
    """A database execute wrapper (Django's instrumentation hook) that rejects INSERTs into `table` (a table
    full: a lost connection would be retried once, `core.failover.lost_or_conflicted`)."""

    def __init__(self, table, times=None):
        self.table, self.times, self.fired = table, times, 0

    def __call__(self, execute, sql, params, many, context):
        if (
            sql.lstrip().upper().startswith("INSERT")
            and self.table in sql
            and (self.times is None or self.fired < self.times)
        ):
            self.fired += 1
            raise OperationalError(1114, "The table is full")
        return execute(sql, params, many, context)


@pytest.mark.django_db
def test_audit_write_error_is_counted_not_raised(run, caplog):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    with connection.execute_wrapper(_FailInserts("diagnosis_trace_event", times=2)):
        rec.routing_decision(intent="DIAGNOSIS", confidence=0.9, reason="r", fallback=False)
        rec.release(decision="PUBLISHED", reason="secret-content-should-not-be-logged")
    rec.finish(status=RunStatus.SUCCESS, content="answer")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS  # the caller ran to the end
    assert run.audit_write_failures == 2
    assert run.expected_events == 4
    assert TraceEvent.objects.filter(run_id=run.run_id).count() == 2
    assert [e.sequence_no for e in _events(run.run_id)] == [1, 2]  # no hole where writes failed
    assert verify_chain(_events(run.run_id)).valid
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "audit write failed" in logged and run.run_id in logged
    assert "secret-content" not in logged and "is full" not in logged
    # The routing decision's run update was in the failed transaction; intent was rolled back with it.
    assert run.intent is None


class _LoseConnection:
    """Fails the first INSERT into `table` with `code` (2013: the connection was lost; 1213: Galera's
    certification conflict) before it runs."""

    def __init__(self, table, code):
        self.table, self.code, self.fired = table, code, 0

    def __call__(self, execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("INSERT") and self.table in sql and not self.fired:
            self.fired += 1
            raise OperationalError(self.code, "Lost connection to server during query")
        return execute(sql, params, many, context)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("code", "after"),
    [(2013, False), (2013, True), (1213, False)],
    ids=["lost-before-commit", "lost-after-commit", "galera-conflict"],
)
def test_a_lost_connection_or_a_certification_conflict_is_retried_once_never_written_twice(
    run, caplog, code, after
):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    lose = _LoseConnection("diagnosis_trace_event", code)
    if after:  # the write commits, then its connection is lost before the answer arrives
        inner = rec.chain._submit

        def submit(op):
            inner(op)
            if not lose.fired:
                lose.fired += 1
                raise OperationalError(code, "Lost connection to server during query")

        rec.chain._submit = submit
        lose.table = "no table"
    with connection.execute_wrapper(lose):
        seq = rec.routing_decision(intent="DIAGNOSIS", confidence=0.9, reason="r", fallback=False)
    rec.finish(status=RunStatus.SUCCESS, content="answer")
    run.refresh_from_db()
    assert lose.fired == 1 and seq == 2
    assert run.audit_write_failures == 0 and run.intent == "DIAGNOSIS"
    events = _events(run.run_id)
    assert [e.sequence_no for e in events] == list(range(1, run.expected_events + 1))
    assert [e.event_type for e in events].count("ROUTING_DECISION") == 1
    assert verify_chain(events).valid
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert ("answer lost, stored" if after else "audit write retried") in logged


@pytest.mark.django_db
def test_failed_model_step_still_declares_its_tool_calls(run):
    rec = RunRecorder.for_run(run)
    call = DeclaredToolCall(tool_call_id="c1", name="lookup_knowledge", arguments="{}")
    with connection.execute_wrapper(_FailInserts("agent_step")):
        rec.model_step(
            step_index=1,
            agent_name="diagnosis_agent",
            model="m",
            usage=usage(10, 5),
            reasoning=build_capture(reasoning=None, text=""),
            tool_calls=[call],
        )
    assert rec.audit_write_failures == 1
    assert not AgentStep.objects.filter(run_id=run.run_id).exists()
    assert not AgentReasoningAudit.objects.filter(run_id=run.run_id).exists()  # same transaction
    rec.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={})
    rec.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="ok")
    tool = ToolInvocation.objects.get(run_id=run.run_id)
    assert tool.status == ToolStatus.SUCCEEDED and tool.step_id is None


@pytest.mark.django_db
def test_tool_row_is_kept_when_only_the_start_write_failed(run):
    rec = RunRecorder.for_run(run)
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="m",
        usage=usage(1, 1),
        reasoning=build_capture(reasoning=None, text=""),
        tool_calls=[DeclaredToolCall(tool_call_id="c1", name="t", arguments="{}")],
    )
    with connection.execute_wrapper(_FailInserts("tool_invocation")):
        rec.tool_started(tool_call_id="c1", tool_name="t", input_params={"q": 1})
    rec.tool_finished(tool_call_id="c1", status=ToolStatus.FAILED, error_code="BOOM", error_message="x")
    tool = ToolInvocation.objects.get(run_id=run.run_id)
    assert tool.status == ToolStatus.FAILED and tool.error_code == "BOOM"
    assert rec.audit_write_failures == 1


# --------------------------------------------------------------------------------------------------
# Tool lifecycle
# --------------------------------------------------------------------------------------------------
def _declare(rec, *ids, step_index=1):
    rec.model_step(
        step_index=step_index,
        agent_name="diagnosis_agent",
        model="m",
        usage=usage(1, 1),
        reasoning=build_capture(reasoning=None, text=""),
        tool_calls=[DeclaredToolCall(tool_call_id=i, name="lookup_knowledge", arguments="{}") for i in ids],
    )


@pytest.mark.django_db
def test_undeclared_tool_start_is_refused_and_recorded(recorder, run):
    with pytest.raises(ToolCallNotDeclared):
        recorder.tool_started(tool_call_id="ghost", tool_name="lookup_knowledge", input_params={})
    assert not ToolInvocation.objects.filter(run_id=run.run_id).exists()
    event = TraceEvent.objects.get(run_id=run.run_id)
    assert event.event_type == EventType.TOOL_INVOCATION and event.status == "REFUSED"


@pytest.mark.django_db
def test_running_row_is_committed_before_the_tool_runs(recorder, run):
    _declare(recorder, "c1")
    recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"query": "q"})
    row = ToolInvocation.objects.get(run_id=run.run_id, tool_call_id="c1")
    assert row.status == ToolStatus.RUNNING and row.started_at is not None
    assert row.input_params == {"query": "q"} and row.step_index == 1 and row.step_id is not None


@pytest.mark.django_db
def test_tool_repeats_are_idempotent_and_conflicts_refused(recorder, run):
    _declare(recorder, "c1")
    recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"query": "q"})
    with pytest.raises(ToolCallRepeated):
        recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"query": "q"})
    with pytest.raises(ToolLifecycleConflict):
        recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"query": "x"})
    recorder.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="result")
    recorder.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="result")
    with pytest.raises(ToolLifecycleConflict):
        recorder.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="other result")
    with pytest.raises(ToolLifecycleConflict):
        recorder.tool_finished(tool_call_id="never", status=ToolStatus.SUCCEEDED, output="x")
    tool_events = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.TOOL_INVOCATION)
    # one start, one terminal, and each of the three refused conflicts
    assert [e.status for e in tool_events.order_by("sequence_no")] == [
        "RUNNING",
        "CONFLICT",
        "SUCCEEDED",
        "CONFLICT",
        "CONFLICT",
    ]
    assert ToolInvocation.objects.get(tool_call_id="c1").duration_ms is not None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "run_status,tool_status",
    [
        (RunStatus.FAILED, ToolStatus.FAILED),
        (RunStatus.CANCELLED, ToolStatus.INTERRUPTED),
        (RunStatus.SUCCESS, ToolStatus.ABANDONED),
    ],
)
def test_dangling_tools_closed_when_the_run_ends(recorder, run, run_status, tool_status):
    _declare(recorder, "c1", "c2")
    recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={})
    recorder.tool_started(tool_call_id="c2", tool_name="lookup_knowledge", input_params={})
    recorder.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="ok")
    recorder.finish(status=run_status)
    assert ToolInvocation.objects.get(tool_call_id="c1").status == ToolStatus.SUCCEEDED
    dangling = ToolInvocation.objects.get(tool_call_id="c2")
    assert dangling.status == tool_status and dangling.finished_at is not None


@pytest.mark.django_db
def test_sweeper_closes_tools_with_unknown_duration(recorder, run):
    _declare(recorder, "c1")
    recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={})
    sweeper = RunRecorder.resume(run.run_id)
    sweeper.finish(status=RunStatus.FAILED, error_code="LEASE_EXPIRED", error_message="lease expired")
    tool = ToolInvocation.objects.get(tool_call_id="c1")
    assert tool.status == ToolStatus.FAILED and tool.duration_ms is None
    run.refresh_from_db()
    assert run.expected_tools == 1 and run.error_code == "LEASE_EXPIRED"
    assert verify_chain(_events(run.run_id)).valid


@pytest.mark.django_db
def test_large_tool_output_is_bounded_with_length_and_sha256(recorder, run):
    import hashlib

    _declare(recorder, "c1")
    output = "日志🚀" * 400_000  # 1.2 M characters
    recorder.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"q": "x" * 5000})
    recorder.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output=output)
    tool = ToolInvocation.objects.get(tool_call_id="c1")
    assert len(tool.output_preview) == 500 and tool.output_preview == output[:500]
    assert tool.output_length == len(output)
    assert tool.output_sha256 == hashlib.sha256(output.encode()).hexdigest()
    assert tool.is_truncated
    assert tool.input_params["q"]["length"] == 5000  # long input strings are bounded too
    for event in _events(run.run_id):
        assert len(json.dumps(event.details, ensure_ascii=False)) <= 8000


# --------------------------------------------------------------------------------------------------
# Token ledger
# --------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_token_ledger_per_source_and_reconciled(run):
    record_full_run(run)
    run.refresh_from_db()
    assert run.tokens_router == 140
    assert run.tokens_agent == 860 + 1590
    assert run.tokens_guard == 625
    assert run.tokens_total == 140 + 860 + 1590 + 625
    assert run.tokens_reasoning == 70 and run.tokens_cached_input == 128
    assert run.model_calls == 4 and run.usage_unavailable_calls == 0
    assert run.tokens_reconciled


@pytest.mark.django_db
def test_missing_usage_is_unavailable_not_zero_and_not_reconciled(recorder, run):
    recorder.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="m",
        usage=Usage.unavailable(),
        reasoning=build_capture(reasoning=None, text="answer"),
    )
    recorder.finish(status=RunStatus.SUCCESS, content="answer")
    run.refresh_from_db()
    step = AgentStep.objects.get(run_id=run.run_id)
    assert step.usage_available is False and step.total_tokens is None and step.prompt_tokens is None
    assert run.usage_unavailable_calls == 1 and not run.tokens_reconciled


@pytest.mark.django_db
def test_lost_usage_record_breaks_reconciliation(recorder, run):
    with connection.execute_wrapper(_FailInserts("diagnosis_trace_event", times=1)):
        recorder.semantic_guard(model="g", usage=usage(10, 2), supported=True)
    recorder.finish(status=RunStatus.SUCCESS, content="x")
    run.refresh_from_db()
    assert run.tokens_total == 12 and not run.tokens_reconciled and run.audit_write_failures == 1


@pytest.mark.django_db
def test_timing_fields(run):
    record_full_run(run)
    run.refresh_from_db()
    assert run.created_at <= run.started_at <= run.first_model_request_at <= run.first_output_at
    assert run.first_output_at <= run.finished_at
    assert run.total_duration_ms is not None and run.total_duration_ms >= 0
    assert run.first_output_latency_ms is not None
    assert DiagnosisRun.objects.get(pk=run.pk).lease_owner == ""
