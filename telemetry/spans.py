"""A run's durable record as OpenTelemetry GenAI spans (a projection of `audit.read.get_trace`).

`project_trace(trace)` turns the trace read model (never a live run's memory) into `ReadableSpan`s ready
for an exporter, under the GenAI conventions' latest experimental names: a root `invoke_agent` (chat) or
`invoke_workflow` (AI Ops), `chat {model}` per model call, `execute_tool {name}` per tool invocation and
`apply_guardrail {guard}` per guard verdict (an MCP tool's with the GenAI MCP attributes). It never reads
reasoning content (a model-call span carries a reference to the governed endpoint), carries tool content
only as opt-in bounded previews (an MCP call's never), and reports only usage the provider reported. Ids
and times are deterministic: a re-export is the same trace. Details: docs/observability.md, *Span shape*.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.urls import reverse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from audit.models import CHAT_AGENT_NAME, AgentStep, EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.payloads import canonical_json, clip
from audit.read import Trace
from diagnosis.models import AgentFlow, RunStatus

SCOPE = InstrumentationScope("diagnosis.telemetry", "1")
ROOT_AGENT = CHAT_AGENT_NAME
PREVIEW_CHARS = 500
GUARDRAIL_DRAFT = "apply_guardrail: GenAI security guardian draft (semantic-conventions PR 3233)"
DEFAULT_SERVICE_NAME = "diagnosis-agent"


# -------------------------------------------------------------------------------------------------
# Ids and times
# -------------------------------------------------------------------------------------------------
def trace_id_of(run_id: str) -> int:
    """The trace id of a run: the first 16 bytes of sha256(run id) (never the invalid 0)."""
    value = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big")
    return value or 1


def span_id_of(run_id: str, key: str) -> int:
    """The span id of one record of a run: the first 8 bytes of sha256(run id, NUL, key)."""
    value = int.from_bytes(hashlib.sha256(f"{run_id}\x00{key}".encode()).digest()[:8], "big")
    return value or 1


def _ns(moment: dt.datetime | None) -> int | None:
    if moment is None:
        return None
    return int(moment.timestamp() * 1_000_000) * 1000


def _before(moment: dt.datetime, duration_ms: Any) -> dt.datetime:
    if isinstance(duration_ms, int | float) and duration_ms > 0:
        return moment - dt.timedelta(milliseconds=duration_ms)
    return moment


def resource() -> Resource:
    """The exporting service (`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` as the SDK reads
    them; `diagnosis-agent` when no service name is configured)."""
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": DEFAULT_SERVICE_NAME}
    return Resource.create(attributes)


def reasoning_ref(trace: Trace) -> str:
    """The governed reasoning endpoint of the run (permission-checked, every read logged)."""
    path = reverse("api-trace-reasoning", kwargs={"sessionId": trace.session_id})
    return f"{path}?runId={quote(trace.run.run_id, safe='')}"


# -------------------------------------------------------------------------------------------------
# Attributes
# -------------------------------------------------------------------------------------------------
def usage_attributes(
    *,
    available: bool,
    input_tokens: Any,
    output_tokens: Any,
    reasoning_tokens: Any = None,
    cached_tokens: Any = None,
) -> dict[str, int]:
    """`gen_ai.usage.*` for the counts the provider reported; nothing for an unreported one."""
    if not available:
        return {}
    pairs = (
        ("gen_ai.usage.input_tokens", input_tokens),
        ("gen_ai.usage.output_tokens", output_tokens),
        ("gen_ai.usage.reasoning.output_tokens", reasoning_tokens),
        ("gen_ai.usage.cache_read.input_tokens", cached_tokens),
    )
    return {key: int(value) for key, value in pairs if isinstance(value, int) and not isinstance(value, bool)}


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    """Drop absent values (OpenTelemetry attributes have no null)."""
    return {k: v for k, v in attributes.items() if v is not None and v != ""}


def capture_content() -> bool:
    return bool(settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)


# -------------------------------------------------------------------------------------------------
# The projection
# -------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Builder:
    trace: Trace
    resource: Resource
    spans: list[ReadableSpan]

    @property
    def run_id(self) -> str:
        return self.trace.run.run_id

    def context(self, key: str) -> SpanContext:
        return SpanContext(
            trace_id=trace_id_of(self.run_id),
            span_id=span_id_of(self.run_id, key),
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )

    def add(
        self,
        *,
        key: str,
        name: str,
        parent: SpanContext | None,
        start: dt.datetime | None,
        end: dt.datetime | None,
        attributes: dict[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
        status: Status | None = None,
        events: Iterable[Event] = (),
    ) -> SpanContext:
        context = self.context(key)
        start = start or end
        end = end or start
        if start is not None and end is not None and end < start:
            end = start
        self.spans.append(
            ReadableSpan(
                name=name,
                context=context,
                parent=parent,
                resource=self.resource,
                attributes=_clean(attributes),
                events=tuple(events),
                kind=kind,
                status=status or Status(StatusCode.UNSET),
                start_time=_ns(start),
                end_time=_ns(end),
                instrumentation_scope=SCOPE,
            )
        )
        return context


def project_trace(trace: Trace, *, resource_: Resource | None = None) -> list[ReadableSpan]:
    """The spans of one run's trace (see the module docstring); the root span first."""
    run = trace.run
    builder = _Builder(trace=trace, resource=resource_ or resource(), spans=[])
    provider = trace.provider.name if trace.provider is not None else (run.provider or None)
    end = run.finished_at or _last_time(trace)
    start = run.started_at or run.created_at
    workflow = run.agent_flow == AgentFlow.AI_OPS

    root_status = None
    if run.status == RunStatus.FAILED:
        root_status = Status(StatusCode.ERROR, clip(run.error_code or "FAILED", 64))
    root_attributes = {
        "gen_ai.operation.name": "invoke_workflow" if workflow else "invoke_agent",
        "gen_ai.agent.name": None if workflow else ROOT_AGENT,
        "gen_ai.conversation.id": trace.session_id,
        "gen_ai.provider.name": provider,
        "diagnosis.run.id": run.run_id,
        "diagnosis.run.agent_flow": run.agent_flow,
        "diagnosis.run.status": run.status,
        "diagnosis.run.intent": run.intent,
        "diagnosis.run.release_decision": run.release_decision,
        "diagnosis.run.release_mode": run.release_mode,
        "diagnosis.run.model_calls": run.model_calls,
        "diagnosis.audit.complete": trace.summary.audit_complete,
        "diagnosis.audit.chain_valid": trace.summary.chain_valid,
        "diagnosis.audit.write_failures": trace.summary.audit_write_failures,
        "error.type": run.error_code if run.status == RunStatus.FAILED else None,
    }
    root = builder.context("run")

    # Agents: in a workflow one invoke_agent span per agent name of the steps, else the root itself.
    # Step indexes count per agent; a tool names its declaring step by id, and its agent (blank on
    # rows recorded before per-agent counters: the chat agent's).
    agent_of_step_id = {step.id: step.agent_name for step in trace.steps}

    def agent_of(tool: ToolInvocation) -> str:
        return agent_of_step_id.get(tool.step_id) or tool.agent_name or CHAT_AGENT_NAME

    parents: dict[str, SpanContext] = {}
    if workflow:
        for name in dict.fromkeys(step.agent_name for step in trace.steps):
            steps = [s for s in trace.steps if s.agent_name == name]
            tools = [t for t in trace.tools if agent_of(t) == name]
            times = [m for s in steps for m in (s.started_at, s.finished_at, s.created_at) if m]
            times += [m for t in tools for m in (t.started_at, t.finished_at) if m]
            parents[name] = builder.add(
                key=f"agent:{name}",
                name=f"invoke_agent {name}",
                parent=root,
                start=min(times) if times else start,
                end=max(times) if times else end,
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": name,
                    "gen_ai.conversation.id": trace.session_id,
                    "gen_ai.provider.name": provider,
                    "diagnosis.run.id": run.run_id,
                },
            )

    usage_after = _usage_by_sequence(trace.timeline)
    ref = reasoning_ref(trace)
    for event in trace.timeline:
        if event.event_type == EventType.ROUTING_ATTEMPT:
            _router_call(builder, event, usage_after.get(event.sequence_no), root, provider, ref)
        elif event.event_type in (EventType.EVIDENCE_GUARD_INITIAL, EventType.EVIDENCE_GUARD_RETRY):
            _evidence_guard(builder, event, root)
        elif event.event_type == EventType.SEMANTIC_GUARD_DECISION:
            _semantic_guard(builder, event, usage_after.get(event.sequence_no), root, provider, ref)
    for step in trace.steps:
        _agent_step(builder, step, parents.get(step.agent_name, root), provider, ref, end)
    mcp = _mcp_endpoints(trace.timeline)
    for tool in trace.tools:
        parent = parents.get(agent_of(tool), root)
        _tool_call(builder, tool, parent, end, mcp)

    # The root encloses its children (a call's start is its event's time less its recorded duration).
    children = builder.spans
    builder.spans = []
    starts = [s.start_time for s in children if s.start_time is not None]
    if starts and (start is None or min(starts) < _ns(start)):
        start = dt.datetime.fromtimestamp(min(starts) / 1e9, tz=dt.UTC)
    builder.add(
        key="run",
        name="invoke_workflow" if workflow else f"invoke_agent {ROOT_AGENT}",
        parent=None,
        start=start,
        end=end,
        attributes=root_attributes,
        status=root_status,
        events=[_timeline_event(event) for event in trace.timeline],
    )
    return builder.spans + children


def _last_time(trace: Trace) -> dt.datetime:
    if trace.timeline:
        return trace.timeline[-1].created_at
    return trace.run.updated_at or trace.run.created_at


def _timeline_event(event: TraceEvent) -> Event:
    return Event(
        name=event.event_type,
        attributes=_clean(
            {
                "diagnosis.sequence_no": event.sequence_no,
                "diagnosis.hash": event.hash,
                "diagnosis.phase": event.phase,
                "diagnosis.status": event.status,
            }
        ),
        timestamp=_ns(event.created_at),
    )


def _usage_by_sequence(timeline: list[TraceEvent]) -> dict[int, dict]:
    """The MODEL_TOKEN_USAGE details written with each decision event, keyed by the decision's
    sequence number (the recorder writes the usage right after its decision, in one transaction)."""
    found: dict[int, dict] = {}
    for previous, event in itertools.pairwise(timeline):
        if event.event_type == EventType.MODEL_TOKEN_USAGE and event.sequence_no == previous.sequence_no + 1:
            found[previous.sequence_no] = event.details or {}
    return found


def _usage_from_details(details: dict | None) -> dict[str, int]:
    details = details or {}
    return usage_attributes(
        available=bool(details.get("usageAvailable")),
        input_tokens=details.get("promptTokens"),
        output_tokens=details.get("completionTokens"),
        reasoning_tokens=details.get("reasoningTokens"),
        cached_tokens=details.get("cachedTokens"),
    )


def _reasoning_attributes(details: dict, ref: str) -> dict[str, Any]:
    if "reasoningAvailable" not in details:
        return {}
    return {
        "diagnosis.reasoning.available": bool(details.get("reasoningAvailable")),
        "diagnosis.reasoning.ref": ref,
        "diagnosis.reasoning.step_index": details.get("reasoningStepIndex"),
    }


def _chat_attributes(model: str, provider: str | None, source: str) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "diagnosis.call.source": source,
    }


def _router_call(builder, event: TraceEvent, usage: dict | None, parent, provider, ref) -> None:
    details = event.details or {}
    model = str(details.get("model") or "")
    ok = bool(details.get("ok"))
    builder.add(
        key=f"event:{event.sequence_no}",
        name=f"chat {model}".strip(),
        parent=parent,
        start=_before(event.created_at, details.get("durationMs")),
        end=event.created_at,
        kind=SpanKind.CLIENT,
        attributes={
            **_chat_attributes(model, provider, "router"),
            **_usage_from_details(usage),
            **_reasoning_attributes(details, ref),
            "diagnosis.router.attempt": details.get("attempt"),
            "diagnosis.router.ok": ok,
            "diagnosis.router.intent": details.get("intent"),
            "diagnosis.sequence_no": event.sequence_no,
            "error.type": None if ok else "invalid_router_output",
        },
        status=None if ok else Status(StatusCode.ERROR, "router output unusable"),
    )


def _guard_attributes(name: str, event: TraceEvent) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "apply_guardrail",
        "gen_ai.guardian.name": name,
        "gen_ai.security.target.type": "llm_output",
        "gen_ai.security.decision.type": "allow" if event.status == "PASS" else "deny",
        "diagnosis.guard.verdict": event.status,
        "diagnosis.sequence_no": event.sequence_no,
        "diagnosis.semconv.draft": GUARDRAIL_DRAFT,
    }


def _evidence_guard(builder, event: TraceEvent, parent) -> None:
    details = event.details or {}
    builder.add(
        key=f"event:{event.sequence_no}",
        name="apply_guardrail evidence_guard",
        parent=parent,
        start=event.created_at,
        end=event.created_at,
        attributes={
            **_guard_attributes("evidence_guard", event),
            "diagnosis.guard.retry": event.event_type == EventType.EVIDENCE_GUARD_RETRY,
            "diagnosis.guard.reasons": tuple(str(r) for r in details.get("reasons") or ()),
            "diagnosis.guard.cited_count": len(details.get("cited") or []),
        },
    )


def _semantic_guard(builder, event: TraceEvent, usage: dict | None, parent, provider, ref) -> None:
    details = event.details or {}
    model = str(details.get("model") or "")
    start = _before(event.created_at, details.get("durationMs"))
    guard = builder.add(
        key=f"event:{event.sequence_no}",
        name="apply_guardrail semantic_guard",
        parent=parent,
        start=start,
        end=event.created_at,
        attributes={
            **_guard_attributes("semantic_guard", event),
            "diagnosis.guard.unsupported_claims": len(details.get("unsupportedClaims") or []),
        },
        status=Status(StatusCode.ERROR, "guard answer unusable") if event.status == "ERROR" else None,
    )
    builder.add(
        key=f"event:{event.sequence_no}:call",
        name=f"chat {model}".strip(),
        parent=guard,
        start=start,
        end=event.created_at,
        kind=SpanKind.CLIENT,
        attributes={
            **_chat_attributes(model, provider, "semantic_guard"),
            **_usage_from_details(usage),
            **_reasoning_attributes(details, ref),
            "error.type": "invalid_guard_output" if event.status == "ERROR" else None,
        },
    )


def _agent_step(builder, step: AgentStep, parent, provider, ref, run_end) -> None:
    end = step.finished_at or step.created_at
    start = step.started_at or _before(end, step.duration_ms)
    builder.add(
        key=f"step:{step.id}",
        name=f"chat {step.model}".strip(),
        parent=parent,
        start=start,
        end=end,
        kind=SpanKind.CLIENT,
        attributes={
            **_chat_attributes(step.model, provider, "agent"),
            "gen_ai.agent.name": step.agent_name,
            "gen_ai.response.finish_reasons": (step.finish_reason,) if step.finish_reason else None,
            **usage_attributes(
                available=step.usage_available,
                input_tokens=step.prompt_tokens,
                output_tokens=step.completion_tokens,
                reasoning_tokens=step.reasoning_tokens,
                cached_tokens=step.cached_tokens,
            ),
            "diagnosis.step.index": step.step_index,
            "diagnosis.step.tool_calls": len(step.tool_call_ids or []),
            "diagnosis.step.content_source": step.content_source,
            "diagnosis.reasoning.available": step.reasoning_available,
            "diagnosis.reasoning.ref": ref,
            "diagnosis.reasoning.step_index": step.step_index,
        },
    )


_TOOL_ERRORS = {ToolStatus.FAILED, ToolStatus.ABANDONED, ToolStatus.INTERRUPTED}


MCP_SEPARATOR = "__"  # an MCP server's tool is offered as `<server>__<tool>` (agent.mcp.toolset)


def _mcp_endpoints(timeline: list[TraceEvent]) -> dict[str, dict]:
    """`{server: how it is reached}` of the MCP servers the run was offered tools of, from the
    configuration chained in its RUN_STARTED (`tools.mcp`); empty for a run offered none."""
    for event in timeline:
        if event.event_type == EventType.RUN_STARTED:
            configuration = (event.details or {}).get("configuration") or {}
            mcp = (configuration.get("tools") or {}).get("mcp") or {}
            facts = {key: mcp.get(key) or {} for key in ("transports", "addresses", "ports")}
            return {
                str(name): {"transport": facts["transports"].get(name)}
                | ({"address": facts["addresses"][name]} if name in facts["addresses"] else {})
                | ({"port": facts["ports"][name]} if name in facts["ports"] else {})
                for name in mcp.get("servers") or ()
            }
    return {}


def _mcp_attributes(tool_name: str, mcp: dict[str, dict]) -> dict[str, Any] | None:
    """The GenAI MCP conventions' client attributes of a call of an MCP server's tool (None for a native
    tool): the method, the transport and, over HTTP, the server's host and port. Never a session id (a
    live streamable HTTP session's handle) nor any argument or result."""
    server, sep, _tool = tool_name.partition(MCP_SEPARATOR)
    if not sep or server not in mcp:
        return None
    endpoint = mcp[server]
    http = endpoint.get("transport") == "streamable-http"
    return {
        "mcp.method.name": "tools/call",
        "network.transport": "tcp" if http else "pipe",
        "network.protocol.name": "http" if http else None,
        "server.address": endpoint.get("address") if http else None,
        "server.port": endpoint.get("port") if http else None,
        "diagnosis.mcp.server": server,
    }


def _tool_call(builder, tool: ToolInvocation, parent, run_end, mcp: dict[str, dict]) -> None:
    failed = tool.status in _TOOL_ERRORS
    mcp_attributes = _mcp_attributes(tool.tool_name, mcp)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool.tool_name,
        "gen_ai.tool.call.id": tool.tool_call_id,
        "gen_ai.tool.type": "function",
        "diagnosis.tool.status": tool.status,
        "diagnosis.tool.step_index": tool.step_index,
        "diagnosis.tool.agent_name": tool.agent_name,
        "diagnosis.tool.output_length": tool.output_length,
        "diagnosis.tool.output_sha256": tool.output_sha256,
        "error.type": (tool.error_code or tool.status) if failed else None,
        **(mcp_attributes or {}),
    }
    if capture_content() and mcp_attributes is None:  # an MCP call's content: never (docs/mcp.md)
        arguments = canonical_json(tool.input_params or {})
        attributes["gen_ai.tool.call.arguments"] = clip(arguments, PREVIEW_CHARS)
        attributes["gen_ai.tool.call.result"] = clip(tool.output_preview, PREVIEW_CHARS)
    status = None
    if failed:
        status = Status(StatusCode.ERROR, clip(tool.error_code or tool.status, 64))
    builder.add(
        key=f"tool:{tool.id}",
        name=f"execute_tool {tool.tool_name}",
        parent=parent,
        start=tool.started_at or tool.created_at,
        end=tool.finished_at or run_end,
        attributes=attributes,
        status=status,
    )


def describe(spans: list[ReadableSpan]) -> str:
    """A compact JSON view of span names and parents (for logs and the management command)."""
    names = {s.context.span_id: s.name for s in spans}
    return json.dumps([[s.name, names.get(s.parent.span_id) if s.parent else None] for s in spans])
