"""The projection of a run's durable record into GenAI spans (`telemetry.spans`), and the outbox
(`telemetry.outbox`) exporting through the SDK's own in-memory exporter (the Phoenix tests export the
same spans over OTLP/HTTP to a real Phoenix: test_phoenix.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from audit.read import get_trace
from diagnosis.models import RunStatus
from telemetry.models import ExportState, TraceExport
from telemetry.outbox import enqueue_finished_runs, export_due, requeue
from telemetry.spans import project_trace, span_id_of, trace_id_of
from tests.telemetry.support import (
    REASONING_MARKER,
    by_name,
    make_recorded_run,
    parent_name,
    record_aiops_run,
    record_blocked_run,
    record_failed_run,
)

pytestmark = pytest.mark.django_db(transaction=True)


def spans_of(run):
    return project_trace(get_trace(run=run))


def test_tool_using_run_span_tree_and_attributes(user):
    run = make_recorded_run(user, tools=2)
    spans = spans_of(run)
    names = by_name(spans)
    root = spans[0]
    assert root.name == "invoke_agent diagnosis_agent" and root.parent is None
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.name"] == "diagnosis_agent"
    assert root.attributes["gen_ai.conversation.id"] == run.session_id
    assert root.attributes["diagnosis.run.id"] == run.run_id
    assert root.attributes["diagnosis.run.release_decision"] == "PUBLISHED"
    assert root.attributes["diagnosis.run.status"] == "SUCCESS"
    assert root.context.trace_id == trace_id_of(run.run_id)
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}

    # Model calls: the router attempt, two agent steps, the semantic guard's call.
    router = names["chat router-m"][0]
    assert parent_name(spans, router) == root.name
    assert router.attributes["gen_ai.usage.input_tokens"] == 120
    assert router.attributes["gen_ai.usage.output_tokens"] == 20
    steps = names["chat agent-m"]
    assert len(steps) == 2 and all(parent_name(spans, s) == root.name for s in steps)
    first = min(steps, key=lambda s: s.attributes["diagnosis.step.index"])
    assert first.attributes["gen_ai.request.model"] == "agent-m"
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert first.attributes["gen_ai.usage.input_tokens"] == 800
    assert first.attributes["gen_ai.usage.reasoning.output_tokens"] == 40
    assert first.attributes["gen_ai.usage.cache_read.input_tokens"] == 128
    assert first.attributes["diagnosis.reasoning.available"] is True
    assert first.attributes["diagnosis.reasoning.ref"] == (
        f"/api/diagnosis/{run.session_id}/trace/reasoning?runId={run.run_id}"
    )
    guard = names["apply_guardrail semantic_guard"][0]
    assert guard.attributes["gen_ai.operation.name"] == "apply_guardrail"
    assert guard.attributes["gen_ai.security.decision.type"] == "allow"
    assert "draft" in guard.attributes["diagnosis.semconv.draft"]
    guard_call = names["chat guard-m"][0]
    assert parent_name(spans, guard_call) == "apply_guardrail semantic_guard"
    assert guard_call.attributes["gen_ai.usage.output_tokens"] == 25
    assert names["apply_guardrail evidence_guard"][0].attributes["diagnosis.guard.verdict"] == "PASS"

    tools = names["execute_tool lookup_knowledge"]
    assert len(tools) == 2
    assert {t.attributes["gen_ai.tool.call.id"] for t in tools} == {"call_0", "call_1"}
    assert all(t.attributes["gen_ai.tool.type"] == "function" for t in tools)
    assert all(t.attributes["diagnosis.tool.status"] == "SUCCEEDED" for t in tools)
    # Content is opt-in: off by default.
    assert all("gen_ai.tool.call.arguments" not in t.attributes for t in tools)

    # Every timeline event is a span event of the root, with its sequence number and hash, in order.
    trace = get_trace(run=run)
    assert [e.attributes["diagnosis.sequence_no"] for e in root.events] == [
        e.sequence_no for e in trace.timeline
    ]
    assert [e.attributes["diagnosis.hash"] for e in root.events] == [e.hash for e in trace.timeline]

    # Recorded times: the root spans the run, every child inside it (to the microsecond).
    assert root.start_time <= min(s.start_time for s in spans)
    assert root.end_time == int(run.finished_at.timestamp() * 1_000_000) * 1000


def test_no_reasoning_text_in_any_span(user):
    for run in (make_recorded_run(user), record_blocked_run(user), record_aiops_run(user)):
        for span in spans_of(run):
            assert REASONING_MARKER not in str(span.to_json())


def test_content_capture_is_opt_in_and_bounded(user, settings):
    settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = True
    run = make_recorded_run(user, tools=1)
    tool = by_name(spans_of(run))["execute_tool lookup_knowledge"][0]
    assert '"query":"replication lag 0"' in tool.attributes["gen_ai.tool.call.arguments"]
    assert 0 < len(tool.attributes["gen_ai.tool.call.result"]) <= 500


def test_blocked_run_and_unknown_usage_is_absent_not_zero(user):
    run = record_blocked_run(user)
    spans = spans_of(run)
    names = by_name(spans)
    assert spans[0].attributes["diagnosis.run.release_decision"] == "BLOCKED"
    for span in names["chat router-m"] + names["chat agent-m"]:
        assert not any(key.startswith("gen_ai.usage.") for key in span.attributes), span.name
    assert names["chat guard-m"][0].attributes["gen_ai.usage.input_tokens"] == 300
    assert names["apply_guardrail evidence_guard"][0].attributes["gen_ai.security.decision.type"] == "deny"
    assert names["apply_guardrail semantic_guard"][0].attributes["diagnosis.guard.verdict"] == "FAIL"


def test_failed_run_marks_errors(user):
    run = record_failed_run(user)
    spans = spans_of(run)
    root = spans[0]
    assert root.status.status_code == StatusCode.ERROR
    assert root.attributes["error.type"] == "PROVIDER_ERROR"
    assert root.attributes["diagnosis.run.status"] == RunStatus.FAILED
    assert "diagnosis.run.release_decision" not in root.attributes
    tool = by_name(spans)["execute_tool lookup_knowledge"][0]
    assert tool.status.status_code == StatusCode.ERROR
    assert tool.attributes["error.type"] == "TOOL_TIMEOUT"


def test_aiops_run_is_a_workflow_with_one_agent_span_per_agent(user):
    run = record_aiops_run(user)
    spans = spans_of(run)
    names = by_name(spans)
    root = spans[0]
    assert root.name == "invoke_workflow"
    assert root.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert set(names["invoke_agent planner"] + names["invoke_agent executor"]) <= set(spans)
    assert parent_name(spans, names["invoke_agent planner"][0]) == "invoke_workflow"
    assert parent_name(spans, names["chat planner-m"][0]) == "invoke_agent planner"
    executor_calls = names["chat executor-m"]
    assert len(executor_calls) == 2
    assert all(parent_name(spans, s) == "invoke_agent executor" for s in executor_calls)
    tool = names["execute_tool query_metrics"][0]
    assert parent_name(spans, tool) == "invoke_agent executor"
    assert names["invoke_agent executor"][0].attributes["gen_ai.agent.name"] == "executor"


def test_ids_are_deterministic(user):
    run = make_recorded_run(user)
    first, again = spans_of(run), spans_of(run)
    assert [(s.name, s.context.span_id, s.start_time, s.end_time) for s in first] == [
        (s.name, s.context.span_id, s.start_time, s.end_time) for s in again
    ]
    assert first[0].context.span_id == span_id_of(run.run_id, "run")
    assert len({s.context.span_id for s in first}) == len(first)


class _Refusing(InMemorySpanExporter):
    """The SDK's in-memory exporter that refuses while `down` (a collector outage)."""

    down = True

    def export(self, spans):
        if self.down:
            return SpanExportResult.FAILURE
        return super().export(spans)


def test_outbox_enqueues_finished_runs_once_and_retries_with_backoff(user):
    done = make_recorded_run(user)
    from diagnosis import services

    open_run = services.create_run(session=done.session, query="still running")
    assert enqueue_finished_runs() == 1
    assert enqueue_finished_runs() == 0
    assert not TraceExport.objects.filter(run_id=open_run.run_id).exists()

    exporter = _Refusing()
    first = export_due(exporter=exporter)
    assert (first.exported, first.failed) == (0, 1)
    row = TraceExport.objects.get(run_id=done.run_id)
    assert row.state == ExportState.FAILED and row.attempts == 1 and row.last_error
    assert row.next_attempt_at > timezone.now()
    assert export_due(exporter=exporter).failed == 0  # not due yet

    exporter.down = False
    later = timezone.now() + dt.timedelta(hours=1)
    again = export_due(exporter=exporter, now=later)
    assert (again.exported, again.failed) == (1, 0)
    row.refresh_from_db()
    assert row.state == ExportState.EXPORTED and row.attempts == 2 and row.span_count == again.spans
    assert row.exported_at is not None and row.last_error == ""
    assert len(exporter.get_finished_spans()) == row.span_count


def test_requeue_reexports_the_same_trace(user):
    run = make_recorded_run(user)
    exporter = InMemorySpanExporter()
    enqueue_finished_runs()
    export_due(exporter=exporter)
    first = [(s.context.trace_id, s.context.span_id) for s in exporter.get_finished_spans()]
    assert requeue(run_ids=[run.run_id]) == 1
    export_due(exporter=exporter)
    spans = exporter.get_finished_spans()
    assert [(s.context.trace_id, s.context.span_id) for s in spans[len(first) :]] == first


def test_purged_run_is_skipped(user):
    TraceExport.objects.create(run_id="run-gone", enqueued_at=timezone.now(), next_attempt_at=timezone.now())
    assert export_due(exporter=InMemorySpanExporter()).skipped == 1
    assert TraceExport.objects.get(run_id="run-gone").state == ExportState.SKIPPED


def test_backoff_doubles_up_to_its_cap(settings):
    from telemetry.outbox import backoff_seconds

    settings.OTEL_EXPORT_MAX_BACKOFF_SECONDS = 30
    assert [backoff_seconds(n) for n in (1, 2, 3, 4, 5, 6)] == [2, 4, 8, 16, 30, 30]
