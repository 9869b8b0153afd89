"""The rows and events the recorder's decisions are made of (`audit.write.decisions`): a model step's
row and AGENT_MODEL_STEP event, a model call's reasoning row and MODEL_TOKEN_USAGE event, and what a
decision event says about its call's reasoning row. Bounded metadata and sizes only, never the text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from audit.models import CHAT_AGENT_NAME, EventType, Phase
from audit.payloads import bound_json, clip
from audit.write.ops import Insert
from audit.write.rows import tables
from audit.write.runtime_facts import SUMMARY_CHARS, ChainEvent, DeclaredToolCall, Usage
from audit.write.table import Table
from reasoning.capture import CapturedReasoning

ROUTER_AGENT_NAME = "router"
GUARD_AGENT_NAME = "semantic_guard"


def step_insert(
    run_id: str,
    session_id: str,
    *,
    step_index: int,
    agent_name: str,
    model: str,
    usage: Usage,
    reasoning: CapturedReasoning,
    tool_calls: Sequence[DeclaredToolCall],
    finish_reason: str,
    started_at: Any,
    finished_at: Any,
    duration_ms: int | None,
    model_input: Sequence[dict[str, Any]],
    text_length: int,
    provider_attempts: Sequence[dict[str, Any]],
    now: Any,
) -> Insert:
    """The step row of one agent model call: bounded metadata and sizes, never the text."""
    t = tables()
    return Insert(
        t.step,
        t.step.row(
            run_id=run_id,
            session_id=session_id,
            step_index=step_index,
            agent_name=agent_name,
            model=clip(model, 128),
            model_input=bound_json(list(model_input)),
            model_output=bound_json(
                {
                    "textLength": text_length,
                    "finishReason": finish_reason,
                    "toolCalls": [
                        {
                            "id": c.tool_call_id,
                            "providerToolCallId": c.provider_id,
                            "name": c.name,
                            "argumentsLength": len(c.arguments),
                        }
                        for c in tool_calls
                    ],
                }
            ),
            tool_call_ids=[c.tool_call_id for c in tool_calls],
            has_tool_call=bool(tool_calls),
            finish_reason=clip(finish_reason, 32),
            attempts=bound_json(list(provider_attempts)),
            started_at=started_at,
            finished_at=finished_at,
            duration_ms=duration_ms,
            usage_available=usage.available,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            cached_tokens=usage.cached_tokens,
            total_tokens=usage.total_tokens,
            reasoning_available=reasoning.reasoning_available,
            reasoning_bytes=reasoning.reasoning_bytes,
            assistant_bytes=reasoning.assistant_bytes,
            content_source=reasoning.content_source,
            created_at=now,
        ),
        want_id=True,
    )


# ----------------------------------------------------------------------------------------------
# Plan (AI Ops)
# ----------------------------------------------------------------------------------------------


def reasoning_insert(
    run_id: str,
    session_id: str,
    step_index: int,
    agent_name: str,
    reasoning: CapturedReasoning,
    *,
    now: Any = None,
) -> Insert:
    """The `agent_reasoning_audit` row of one model call (seed 000 columns, content as captured)."""
    table: Table = tables().reasoning
    return Insert(
        table,
        table.row(
            session_id=session_id,
            run_id=run_id,
            step_index=step_index,
            agent_name=agent_name,
            reasoning_available=reasoning.reasoning_available,
            reasoning_content=reasoning.reasoning_content,
            assistant_text=reasoning.assistant_text,
            content_source=reasoning.content_source,
            content_bytes=reasoning.content_bytes,
            created_at=now or timezone.now(),
        ),
    )


def usage_event(
    source: str,
    model: str,
    usage: Usage,
    *,
    phase: str,
    step_index: int | None = None,
    agent_name: str,
) -> ChainEvent:
    """MODEL_TOKEN_USAGE: one model call's usage as the provider reported it (or that it did not)."""
    if usage.available:
        summary = (
            f"{source}: {usage.total_tokens} tokens ({usage.prompt_tokens} in, {usage.completion_tokens} out)"
        )
    else:
        summary = f"{source}: usage not reported by the provider"
    details = {
        "source": str(source),
        "agentName": agent_name,
        "model": model,
        "stepIndex": step_index,
        **usage.as_details(),
    }
    return ChainEvent(
        phase,
        EventType.MODEL_TOKEN_USAGE,
        "REPORTED" if usage.available else "UNAVAILABLE",
        summary,
        details,
    )


def reasoning_details(reasoning: CapturedReasoning, step_index: int, agent_name: str) -> dict[str, Any]:
    """What a decision event says about its call's reasoning row: metadata only, never the text."""
    return {
        "reasoningStepIndex": step_index,
        "agentName": agent_name,
        "reasoningAvailable": reasoning.reasoning_available,
        "reasoningBytes": reasoning.reasoning_bytes,
        "assistantBytes": reasoning.assistant_bytes,
        "contentSource": reasoning.content_source,
    }


def step_event(
    step_index: int,
    agent_name: str,
    model: str,
    reasoning: CapturedReasoning,
    tool_calls: Sequence[DeclaredToolCall],
    finish_reason: str,
    duration_ms: int | None,
    provider_attempts: int,
    *,
    bind: dict[str, Insert],
) -> ChainEvent:
    """AGENT_MODEL_STEP: the call's metadata, its declared tool calls and the sizes of what it wrote."""
    names = [c.name for c in tool_calls]
    named = "" if agent_name == CHAT_AGENT_NAME else f"{agent_name} "
    summary = f"{named}step {step_index}: {model}, finish {finish_reason or 'unknown'}"
    if names:
        summary += f", {len(names)} tool call(s): {', '.join(names)}"
    return ChainEvent(
        Phase.AGENT,
        EventType.AGENT_MODEL_STEP,
        "TOOL_CALLS" if tool_calls else "ANSWER",
        clip(summary, SUMMARY_CHARS),
        {
            "stepIndex": step_index,
            "agentName": agent_name,
            "model": model,
            "finishReason": finish_reason,
            "toolCalls": [
                {"id": c.tool_call_id, "providerToolCallId": c.provider_id, "name": c.name}
                for c in tool_calls
            ],
            "durationMs": duration_ms,
            "reasoningAvailable": reasoning.reasoning_available,
            "reasoningBytes": reasoning.reasoning_bytes,
            "assistantBytes": reasoning.assistant_bytes,
            "contentSource": reasoning.content_source,
            "providerAttempts": provider_attempts,
        },
        bind=bind,
    )
