"""Runs of every shape the trace export must project, recorded through the real recorder
(`tests.factories` for the published tool-using run), and span lookups over exported spans."""

from __future__ import annotations

import json

from audit.write import DeclaredToolCall, RunRecorder, Usage
from diagnosis import services
from diagnosis.models import AgentFlow, DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.capture import build_capture
from tests.factories import REASONING_MARKER, executing, make_recorded_run, usage

__all__ = ["REASONING_MARKER", "make_recorded_run", "record_aiops_run", "record_blocked_run"]


def _run(owner, query: str, flow: str = AgentFlow.DIAGNOSIS_AGENT) -> tuple[DiagnosisRun, RunRecorder]:
    session = services.create_session(owner=owner)
    run = services.create_run(session=session, query=query, agent_flow=flow)
    return run, executing(run)


def record_blocked_run(owner) -> DiagnosisRun:
    """Routed with usage the provider did not report, one tool-free answer step, both guards fail:
    BLOCKED."""
    run, rec = _run(owner, "Why is the disk full?")
    rec.run_started(release_mode="verified", details={"provider": "openai"})
    rec.routing_attempt(attempt=1, model="router-m", usage=Usage.unavailable(), ok=True, intent="DIAGNOSIS")
    rec.routing_decision(intent="DIAGNOSIS", confidence=None, reason="disk", fallback=False)
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=Usage.unavailable(),
        reasoning=build_capture(reasoning=f"private thoughts {REASONING_MARKER}", text="It is full."),
        finish_reason="stop",
        duration_ms=300,
    )
    rec.evidence_guard(retry=False, passed=False, reasons=["NO_CITATION"])
    rec.semantic_guard(model="guard-m", usage=usage(300, 10), supported=False, unsupported_claims=["x"])
    rec.release(decision=ReleaseDecision.BLOCKED, reason="no evidence")
    rec.finish(status=RunStatus.SUCCESS, content="The answer was withheld.")
    run.refresh_from_db()
    return run


def record_failed_run(owner) -> DiagnosisRun:
    """One step declares a tool, the tool fails, the run fails with an error code."""
    run, rec = _run(owner, "Why is nginx answering 502?")
    rec.run_started(release_mode="verified", details={"provider": "openai"})
    call = DeclaredToolCall(tool_call_id="call_x", name="lookup_knowledge", arguments='{"query": "502"}')
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=usage(400, 20),
        reasoning=build_capture(reasoning=None, text="", tool_calls=[call.plan()]),
        tool_calls=[call],
        finish_reason="tool_calls",
    )
    rec.tool_started(tool_call_id="call_x", tool_name="lookup_knowledge", input_params={"query": "502"})
    rec.tool_finished(
        tool_call_id="call_x", status="FAILED", error_code="TOOL_TIMEOUT", error_message="took too long"
    )
    rec.finish(status=RunStatus.FAILED, error_code="PROVIDER_ERROR", error_message="The model failed.")
    run.refresh_from_db()
    return run


def record_aiops_run(owner) -> DiagnosisRun:
    """An AI Ops analysis: a planner step, then an executor step calling `query_metrics`, its answer."""
    run, rec = _run(owner, "Alert PrometheusScrapeSlow is firing", flow=AgentFlow.AI_OPS)
    rec.run_started(agent_flow=AgentFlow.AI_OPS, release_mode="verified", details={"provider": "openai"})
    rec.model_step(
        step_index=1,
        agent_name="planner",
        model="planner-m",
        usage=usage(200, 40),
        reasoning=build_capture(reasoning=f"plan {REASONING_MARKER}", text="1. query metrics"),
        finish_reason="stop",
    )
    call = DeclaredToolCall(
        tool_call_id="call_q", name="query_metrics", arguments=json.dumps({"query": "up"})
    )
    rec.model_step(
        step_index=1,
        agent_name="executor",
        model="executor-m",
        usage=usage(500, 30, cached=64),
        reasoning=build_capture(reasoning=None, text="", tool_calls=[call.plan()]),
        tool_calls=[call],
        finish_reason="tool_calls",
    )
    rec.tool_started(tool_call_id="call_q", tool_name="query_metrics", input_params={"query": "up"})
    rec.tool_finished(tool_call_id="call_q", status="SUCCEEDED", output=json.dumps({"result": [1]}))
    rec.model_step(
        step_index=2,
        agent_name="executor",
        model="executor-m",
        usage=usage(700, 80),
        reasoning=build_capture(reasoning=None, text="Prometheus is up [prom:up]."),
        finish_reason="stop",
    )
    rec.evidence_guard(retry=False, passed=True, cited=["prom:up"])
    rec.release(decision=ReleaseDecision.PUBLISHED, reason="guards passed")
    rec.finish(status=RunStatus.SUCCESS, content="Prometheus is up [prom:up].")
    run.refresh_from_db()
    return run


def by_name(spans) -> dict[str, list]:
    found: dict[str, list] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def parent_name(spans, span) -> str | None:
    names = {s.context.span_id: s.name for s in spans}
    return names.get(span.parent.span_id) if span.parent is not None else None
