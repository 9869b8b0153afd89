"""Extract and bound a model step's reasoning and assistant text (seed 000 capture rules).

Reasoning is taken from the message's `reasoning_content` attribute first, then from known extra keys
in a fixed order; each field is cut at 32000 characters. `assistant_text` is the visible text plus, when
the step called tools, a bounded preview of their names and arguments (never results);
`content_source` and `content_bytes` describe exactly what is stored. When the provider sent no
reasoning, `reasoning_available` is false and `reasoning_content` None: nothing is ever synthesised.
Details: docs/runtime.md, *Reasoning of every model call*.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reasoning.models import ContentSource

MAX_FIELD_CHARS = 32000
TOOL_PLAN_ARGS_CHARS = 500
TOOL_PLAN_MAX_CALLS = 20
REASONING_KEYS = (
    "reasoning_content",
    "reasoningContent",
    "reasoning",
    "thinking",
    "reasoning_text",
    "reasoningText",
)


@dataclass(frozen=True, slots=True)
class ToolCallPlan:
    """A tool call the model declared: its name and raw argument string (as the model wrote it)."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class CapturedReasoning:
    """What one model step stores in `agent_reasoning_audit`, already cut and measured."""

    reasoning_available: bool
    reasoning_content: str | None
    assistant_text: str | None
    content_source: str
    reasoning_bytes: int
    assistant_bytes: int
    reasoning_key: str | None = None

    @property
    def content_bytes(self) -> int:
        return self.reasoning_bytes + self.assistant_bytes


def _text_of(value: Any) -> str | None:
    """A reasoning value as text: strings as they are, structured blocks by their text/content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        for key in ("text", "content", "thinking"):
            inner = value.get(key)
            if isinstance(inner, str):
                return inner
        return None
    if isinstance(value, Iterable) and not isinstance(value, (bytes, bytearray)):
        parts = [t for t in (_text_of(v) for v in value) if t]
        return "".join(parts) if parts else None
    return None


def _extras(message: Any) -> Mapping[str, Any]:
    if isinstance(message, Mapping):
        return message
    extra = getattr(message, "model_extra", None)
    if isinstance(extra, Mapping) and extra:
        return extra
    metadata = getattr(message, "metadata", None)
    if isinstance(metadata, Mapping):
        return metadata
    return {}


def extract_reasoning(message: Any) -> tuple[str | None, str | None]:
    """Return `(text, source)` of the first non-empty reasoning source, or `(None, None)`.

    `source` is `"attribute"` for the dedicated attribute, else the extra key that supplied the text.
    Works on whole messages and on streamed deltas alike.
    """
    if message is None:
        return None, None
    if not isinstance(message, Mapping):
        text = _text_of(getattr(message, "reasoning_content", None))
        if text and text.strip():
            return text, "attribute"
    extras = _extras(message)
    for key in REASONING_KEYS:
        text = _text_of(extras.get(key))
        if text and text.strip():
            return text, key
    return None, None


def tool_plan_preview(tool_calls: Iterable[ToolCallPlan]) -> str:
    """`tool_calls:` followed by one bounded `name(arguments)` line per declared call."""
    calls = list(tool_calls)
    lines = ["tool_calls:"]
    for call in calls[:TOOL_PLAN_MAX_CALLS]:
        args = call.arguments or ""
        if len(args) > TOOL_PLAN_ARGS_CHARS:
            args = args[:TOOL_PLAN_ARGS_CHARS] + f"… ({len(call.arguments)} chars)"
        lines.append(f"- {call.name}({args})")
    if len(calls) > TOOL_PLAN_MAX_CALLS:
        lines.append(f"- … {len(calls) - TOOL_PLAN_MAX_CALLS} more")
    return "\n".join(lines)


def build_capture(
    *,
    reasoning: str | None,
    text: str | None,
    tool_calls: Iterable[ToolCallPlan] = (),
    reasoning_key: str | None = None,
) -> CapturedReasoning:
    """Bound and classify a step's reasoning, visible text and declared tool calls."""
    reasoning_content = reasoning[:MAX_FIELD_CHARS] if reasoning and reasoning.strip() else None
    visible = text if text and text.strip() else ""
    calls = list(tool_calls)
    plan = tool_plan_preview(calls) if calls else ""
    assistant = "\n\n".join(part for part in (visible, plan) if part)[:MAX_FIELD_CHARS] or None

    if reasoning_content and assistant:
        source = ContentSource.REASONING_AND_ASSISTANT
    elif reasoning_content:
        source = ContentSource.REASONING
    elif visible:
        source = ContentSource.ASSISTANT_TEXT
    elif plan:
        source = ContentSource.TOOL_CALL_PLAN
    else:
        source = ContentSource.NONE

    return CapturedReasoning(
        reasoning_available=reasoning_content is not None,
        reasoning_content=reasoning_content,
        assistant_text=assistant,
        content_source=str(source),
        reasoning_bytes=len(reasoning_content.encode("utf-8")) if reasoning_content else 0,
        assistant_bytes=len(assistant.encode("utf-8")) if assistant else 0,
        reasoning_key=reasoning_key if reasoning_content else None,
    )


def capture_message(message: Any, *, tool_calls: Iterable[ToolCallPlan] = ()) -> CapturedReasoning:
    """Capture from a whole assistant message (SDK object or mapping) in seed 000's priority order."""
    reasoning, key = extract_reasoning(message)
    text = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
    return build_capture(
        reasoning=reasoning,
        text=text if isinstance(text, str) else None,
        tool_calls=tool_calls,
        reasoning_key=key,
    )
