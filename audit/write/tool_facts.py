"""The facts the recorder keeps about one tool call (`ToolState`) and those its terminal writes: the
terminal's row columns and its TOOL_INVOCATION event, the key a repeated terminal is compared on, and
the digest an approval names. Used by the recorder's tool part (`audit.write.tools.ToolCalls`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from audit.models import EventType, Phase, ToolStatus
from audit.payloads import BoundedText, bound_json, canonical_json, clip, sha256_hex
from audit.verify import row_digests
from audit.write.ops import Insert
from audit.write.runtime_facts import ERROR_MESSAGE_CHARS, SUMMARY_CHARS, ChainEvent, RetrievalFacts

# Tool states that have no terminal yet: executing, or recorded and waiting for a person's decision.
OPEN_TOOL_STATUSES = frozenset({ToolStatus.RUNNING.value, ToolStatus.AWAITING_APPROVAL.value})
# Status of the TOOL_INVOCATION event that records a bare tool error kept until the run's verdict.
ERROR_OBSERVED = "ERROR_OBSERVED"


def arguments_digest(effective_input: Any) -> str:
    """sha256 of the canonical JSON of a call's effective input as recorded (the digest an approval
    names: a decision applies to exactly these arguments)."""
    return sha256_hex(canonical_json(effective_input))


@dataclass(slots=True)
class ToolState:
    name: str
    input_key: str
    step_index: int | None
    started_monotonic: float | None
    started_at: Any
    agent_name: str = ""
    input_params: Any = None
    provider_id: str = ""
    status: str = ToolStatus.RUNNING
    terminal_key: tuple | None = None
    # The tool row as last written (column -> value): the start of its terminal image.
    row: dict[str, Any] = field(default_factory=dict)
    # A bare error observed while the run may still be interrupted: (code, message), no terminal yet;
    # the run's verdict decides (seed 002, `tool_error_observed`).
    observed: tuple[str, str] | None = None


def terminal_key(status: str, output_sha256: str | None, error_code: str, error_message: str) -> tuple:
    """The facts a terminal is compared on (as stored: bounded code and message, sha256 of the output)."""
    message = clip(error_message, ERROR_MESSAGE_CHARS)
    return (str(status), output_sha256 or None, clip(error_code, 64), message)


def terminal_fields(
    status: str,
    now: Any,
    duration_ms: int | None,
    bounded: BoundedText | None,
    error_code: str,
    error_message: str,
    retrieval: RetrievalFacts | None,
) -> dict[str, Any]:
    """The columns a call's terminal update writes: status, end, duration, error, the bounded output's
    facts and the retrieval's."""
    fields: dict[str, Any] = {
        "status": status,
        "finished_at": now,
        "duration_ms": duration_ms,
        "error_code": clip(error_code, 64),
        "error_message": clip(error_message, ERROR_MESSAGE_CHARS),
        "updated_at": now,
    }
    if bounded is not None:
        fields.update(
            output_preview=bounded.preview,
            output_length=bounded.length,
            output_sha256=bounded.sha256,
            is_truncated=bounded.truncated or bool(retrieval and retrieval.is_truncated),
        )
    if retrieval is not None:
        fields.update(
            retrieval_layer=retrieval.layer,
            l0_match_count=retrieval.l0_match_count,
            l1_match_count=retrieval.l1_match_count,
            retrieval_details=bound_json(retrieval.details),
        )
    return fields


def terminal_event(
    tool_call_id: str,
    state: ToolState,
    status: str,
    duration_ms: int | None,
    bounded: BoundedText | None,
    error_code: str,
    retrieval: RetrievalFacts | None,
    summary_note: str,
    row: Insert,
) -> ChainEvent:
    """The TOOL_INVOCATION event of a call's terminal, binding its terminal `row`."""
    parts = [f"{state.name} {status.lower()}"]
    if duration_ms is not None:
        parts.append(f"in {duration_ms} ms")
    if bounded is not None:
        parts.append(f"{bounded.length} chars")
    if error_code:
        parts.append(f"error {error_code}")
    if summary_note:
        parts.append(summary_note)
    details: dict[str, Any] = {
        "toolCallId": tool_call_id,
        "providerToolCallId": state.provider_id or tool_call_id,
        "toolName": state.name,
        "stepIndex": state.step_index,
        "agentName": state.agent_name or None,
        "durationMs": duration_ms,
        "outputLength": bounded.length if bounded else None,
        "outputSha256": bounded.sha256 if bounded else None,
        "errorCode": error_code or None,
    }
    if retrieval is not None:
        details.update(
            retrievalLayer=retrieval.layer,
            l0MatchCount=retrieval.l0_match_count,
            l1MatchCount=retrieval.l1_match_count,
        )
    return ChainEvent(
        Phase.TOOL,
        EventType.TOOL_INVOCATION,
        status,
        clip(", ".join(parts), SUMMARY_CHARS),
        {**details, "rowForm": row_digests.TOOL.name},
        bind={"rowDigest": row},
    )
