"""Runs exported over OTLP/HTTP into a real Phoenix and read back through Phoenix's own REST API."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.utils import timezone

from telemetry.models import ExportState, TraceExport
from telemetry.outbox import enqueue_finished_runs, export_due, make_exporter, requeue
from telemetry.spans import trace_id_of
from tests.telemetry.support import (
    REASONING_MARKER,
    make_recorded_run,
    record_aiops_run,
    record_blocked_run,
    record_failed_run,
)

pytestmark = pytest.mark.django_db(transaction=True)


def export_all(phoenix) -> None:
    enqueue_finished_runs()
    exporter = make_exporter(phoenix.otlp_endpoint)
    try:
        done = export_due(exporter=exporter)
    finally:
        exporter.shutdown()
    assert done.failed == 0, phoenix.log_tail()


def stored(phoenix, run) -> tuple[list[dict], dict[str, dict]]:
    """The run's spans as Phoenix stores them (all of them, once ingested) and a lookup by span id."""
    row = TraceExport.objects.get(run_id=run.run_id)
    assert row.state == ExportState.EXPORTED
    spans = phoenix.wait_for_spans(trace_id_of(run.run_id), row.span_count)
    assert len(spans) == row.span_count
    return spans, {s["context"]["span_id"]: s for s in spans}


def named(spans: list[dict], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]


def parent(by_id: dict[str, dict], span: dict) -> str | None:
    found = by_id.get(span.get("parent_id") or "")
    return found["name"] if found else None


def test_tool_using_run_opens_in_phoenix_with_its_tree_and_usage(user, phoenix_up):
    run = make_recorded_run(user, tools=2)
    export_all(phoenix_up)
    spans, by_id = stored(phoenix_up, run)
    (root,) = [s for s in spans if not s.get("parent_id")]
    assert root["name"] == "invoke_agent diagnosis_agent"
    attrs = root["attributes"]
    assert attrs["gen_ai.conversation.id"] == run.session_id
    assert attrs["diagnosis.run.id"] == run.run_id
    assert attrs["diagnosis.run.release_decision"] == "PUBLISHED"
    # The timeline as span events, in order, with sequence numbers and hashes.
    sequence = [e["attributes"]["diagnosis.sequence_no"] for e in root["events"]]
    assert sequence == sorted(sequence) and sequence[0] == 1 and len(sequence) == run.expected_events
    assert all(len(e["attributes"]["diagnosis.hash"]) == 64 for e in root["events"])

    steps = named(spans, "chat agent-m")
    assert len(steps) == 2 and {parent(by_id, s) for s in steps} == {root["name"]}
    first = min(steps, key=lambda s: s["attributes"]["diagnosis.step.index"])
    assert first["attributes"]["gen_ai.usage.input_tokens"] == 800
    assert first["attributes"]["gen_ai.usage.output_tokens"] == 60
    assert first["attributes"]["gen_ai.usage.reasoning.output_tokens"] == 40
    assert first["attributes"]["gen_ai.usage.cache_read.input_tokens"] == 128
    assert first["attributes"]["gen_ai.request.model"] == "agent-m"
    assert first["attributes"]["diagnosis.reasoning.available"] is True
    assert first["attributes"]["diagnosis.reasoning.ref"].startswith(f"/api/diagnosis/{run.session_id}/")
    assert named(spans, "chat router-m")[0]["attributes"]["gen_ai.usage.input_tokens"] == 120
    guard_call = named(spans, "chat guard-m")[0]
    assert parent(by_id, guard_call) == "apply_guardrail semantic_guard"
    tools = named(spans, "execute_tool lookup_knowledge")
    assert sorted(t["attributes"]["gen_ai.tool.call.id"] for t in tools) == ["call_0", "call_1"]
    assert {parent(by_id, t) for t in tools} == {root["name"]}
    # Model calls, tools and guards in the recorded order.
    order = [s["name"] for s in sorted(spans, key=lambda s: s["start_time"]) if s is not root]
    assert order.index("chat router-m") < order.index("execute_tool lookup_knowledge")
    assert order.index("execute_tool lookup_knowledge") < order.index("apply_guardrail semantic_guard")
    assert REASONING_MARKER not in json.dumps(spans)


def test_blocked_failed_and_aiops_runs_in_phoenix(user, phoenix_up):
    blocked, failed, aiops = record_blocked_run(user), record_failed_run(user), record_aiops_run(user)
    export_all(phoenix_up)

    spans, _ = stored(phoenix_up, blocked)
    root = next(s for s in spans if not s.get("parent_id"))
    assert root["attributes"]["diagnosis.run.release_decision"] == "BLOCKED"
    for span in named(spans, "chat router-m") + named(spans, "chat agent-m"):
        assert not [k for k in span["attributes"] if k.startswith("gen_ai.usage.")], span["name"]
    assert REASONING_MARKER not in json.dumps(spans)

    spans, _ = stored(phoenix_up, failed)
    root = next(s for s in spans if not s.get("parent_id"))
    assert root["status_code"] == "ERROR" and root["attributes"]["error.type"] == "PROVIDER_ERROR"
    tool = named(spans, "execute_tool lookup_knowledge")[0]
    assert tool["status_code"] == "ERROR" and tool["attributes"]["error.type"] == "TOOL_TIMEOUT"

    spans, by_id = stored(phoenix_up, aiops)
    root = next(s for s in spans if not s.get("parent_id"))
    assert root["name"] == "invoke_workflow"
    assert {parent(by_id, s) for s in named(spans, "invoke_agent planner")} == {"invoke_workflow"}
    assert {parent(by_id, s) for s in named(spans, "chat executor-m")} == {"invoke_agent executor"}
    assert parent(by_id, named(spans, "execute_tool query_metrics")[0]) == "invoke_agent executor"
    assert REASONING_MARKER not in json.dumps(spans)


def test_reexport_is_the_same_trace(user, phoenix_up):
    run = make_recorded_run(user)
    export_all(phoenix_up)
    before, _ = stored(phoenix_up, run)
    assert requeue(run_ids=[run.run_id]) == 1
    export_all(phoenix_up)
    after, _ = stored(phoenix_up, run)
    time_to_settle = phoenix_up.spans(trace_id_of(run.run_id))
    ids = sorted(s["context"]["span_id"] for s in before)
    assert sorted(s["context"]["span_id"] for s in after) == ids
    assert sorted(s["context"]["span_id"] for s in time_to_settle) == ids


def test_phoenix_down_then_up_the_outbox_drains_with_nothing_lost(user, phoenix_up, monkeypatch):
    """Over 30 s (about 60 s): it really stops the Phoenix process, waits out the exporter's timeouts
    while it is down, and starts it again (Phoenix takes 15 s or more to answer after a start)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2")
    runs = [make_recorded_run(user) for _ in range(3)]
    phoenix_up.stop()
    try:
        enqueue_finished_runs()
        exporter = make_exporter(phoenix_up.otlp_endpoint)
        down = export_due(exporter=exporter)
        exporter.shutdown()
        assert (down.exported, down.failed) == (0, 3)
        rows = TraceExport.objects.filter(run_id__in=[r.run_id for r in runs])
        assert {r.state for r in rows} == {ExportState.FAILED}
        assert all(r.attempts == 1 and r.last_error for r in rows)
    finally:
        phoenix_up.start()
    exporter = make_exporter(phoenix_up.otlp_endpoint)
    up = export_due(exporter=exporter, now=timezone.now() + dt.timedelta(hours=1))
    exporter.shutdown()
    assert (up.exported, up.failed) == (3, 0)
    for run in runs:
        spans, _ = stored(phoenix_up, run)
        assert any(s["name"] == "invoke_agent diagnosis_agent" for s in spans)


@pytest.mark.usefixtures("runtime_pools")
def test_a_demo_ai_ops_analysis_opens_in_phoenix_as_a_workflow(user, phoenix_up, settings, corpus):
    """The real runtime's planner and executor (offline demo provider), exported from their record."""
    from audit.models import AgentStep, ToolInvocation
    from tests.agent.aiops.support import aiops_registry, run_aiops

    settings.LLM_PROVIDER = "demo"
    run, _, _ = run_aiops(user, registry=aiops_registry())
    assert run.status == "SUCCESS"
    export_all(phoenix_up)
    spans, by_id = stored(phoenix_up, run)
    root = next(s for s in spans if not s.get("parent_id"))
    assert root["name"] == "invoke_workflow"
    agents = {s["attributes"]["gen_ai.agent.name"] for s in spans if s["name"].startswith("invoke_agent ")}
    assert agents == {"planner", "executor"}
    steps = AgentStep.objects.filter(run_id=run.run_id)
    model_calls = [
        s
        for s in spans
        if s["name"].startswith("chat ") and parent(by_id, s) != "apply_guardrail semantic_guard"
    ]
    agent_calls = [s for s in model_calls if s["attributes"].get("diagnosis.call.source") == "agent"]
    assert len(agent_calls) == steps.count()
    for call in agent_calls:
        assert parent(by_id, call) == f"invoke_agent {call['attributes']['gen_ai.agent.name']}"
    for tool in ToolInvocation.objects.filter(run_id=run.run_id):
        (span,) = [s for s in spans if s["attributes"].get("gen_ai.tool.call.id") == tool.tool_call_id]
        assert parent(by_id, span) == f"invoke_agent {tool.agent_name}"
    # The demo model's reasoning and assistant text, as stored (decrypted), appear nowhere in Phoenix.
    from reasoning.models import AgentReasoningAudit

    stored_text = json.dumps(spans)
    texts = [
        text
        for row in AgentReasoningAudit.objects.filter(run_id=run.run_id)
        for text in (row.reasoning_content, row.assistant_text)
        if text and len(text) >= 20
    ]
    assert texts
    assert not [t for t in texts if t[:60] in stored_text]
