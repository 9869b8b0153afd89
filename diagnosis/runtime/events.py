"""What a run tells its live listeners: the chat frames of the API contract, and the sink they go to.

The pipeline reports to an `EventSink` (`async def emit(event)`); the transport decides where frames go
(a WebSocket group, an SSE response, the terminal for `manage.py diagnose`). The events are exactly the
contract's chat frames and carry nothing else: no reasoning, no tool input or output, no trace data.

Order for one run: `RunEvent` first; then answer `DeltaEvent`s as the provider streams them and a
`ToolEvent` per tool status change (RUNNING, then SUCCEEDED / FAILED / INTERRUPTED); a failed run sends
an `ErrorEvent`; every finished run ends with one `OutcomeEvent`, whose `content` is the released content
(when the release is BLOCKED, the safe message replaces the draft that was streamed as deltas).

`RunEvent`, `ToolEvent` and `OutcomeEvent` are emitted only after the timeline event they correspond to
(RUN_STARTED, TOOL_INVOCATION, RUN_FINISHED) committed, and carry its `sequence_no` (None when that audit
write failed, or for tools closed in bulk on cancel) beside the frame, never inside it: transports use it
for SSE `id:` lines and for resuming without gaps or duplicates.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunEvent:
    """Always the first event of a run: which session and run the client is following."""

    session_id: str
    run_id: str
    sequence_no: int | None = None
    type: ClassVar[str] = "run"


@dataclass(frozen=True, slots=True)
class DeltaEvent:
    """A piece of visible answer text as the provider streamed it (never reasoning)."""

    run_id: str
    text: str
    type: ClassVar[str] = "delta"


@dataclass(frozen=True, slots=True)
class ToolEvent:
    """A tool call changed status (RUNNING, then a terminal status); no input, no output."""

    run_id: str
    tool_call_id: str
    name: str
    status: str
    sequence_no: int | None = None
    type: ClassVar[str] = "tool"


@dataclass(frozen=True, slots=True)
class OutcomeEvent:
    """The last event of a finished run: status, release decision and the released content."""

    run_id: str
    status: str
    release_decision: str | None
    content: str
    sequence_no: int | None = None
    type: ClassVar[str] = "outcome"


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """A failed run's error code and safe message (sent before its outcome). `run_id` is for routing
    only and is not part of the frame."""

    code: str
    message: str
    run_id: str = ""
    type: ClassVar[str] = "error"


Event = RunEvent | DeltaEvent | ToolEvent | OutcomeEvent | ErrorEvent
EVENT_TYPES: dict[str, type] = {
    cls.type: cls for cls in (RunEvent, DeltaEvent, ToolEvent, OutcomeEvent, ErrorEvent)
}
# Events that correspond to a timeline event and carry its `sequence_no`.
SEQUENCED_TYPES = frozenset({"run", "tool", "outcome"})


def sequence_of(event: Event) -> int | None:
    """The timeline `sequence_no` an event carries (None for deltas and errors, or when unknown)."""
    return getattr(event, "sequence_no", None) if event.type in SEQUENCED_TYPES else None


def identity(event: Event) -> tuple | None:
    """The identity of an event within one run (None for deltas, which are never deduplicated): one
    `run`, one `outcome`, one `error`, and one `tool` per call and status."""
    if isinstance(event, ToolEvent):
        return ("tool", event.tool_call_id, str(event.status))
    if event.type in ("run", "outcome", "error"):
        return (event.type,)
    return None


def to_message(event: Event) -> dict[str, Any]:
    """The event as plain data (strings, numbers, None) for the channel layer; `from_message` reverses it."""
    fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    return {
        "event": event.type,
        "fields": {k: str(v) if isinstance(v, str) else v for k, v in fields.items()},
    }


def from_message(message: dict[str, Any]) -> Event | None:
    """The event of a `to_message` payload, or None when it is not one."""
    cls = EVENT_TYPES.get(message.get("event")) if isinstance(message.get("event"), str) else None
    fields = message.get("fields")
    if cls is None or not isinstance(fields, dict):
        return None
    try:
        return cls(**fields)
    except TypeError:
        return None


@runtime_checkable
class EventSink(Protocol):
    """Where a run's live events go. `emit` should not block for long; it is awaited in order."""

    async def emit(self, event: Event) -> None: ...


class NullSink:
    """Drops every event (runs started without a listener, e.g. demo data)."""

    async def emit(self, event: Event) -> None:
        return None


class SafeSink:
    """Wraps a sink so that a failing listener (a closed socket) never stops the run: the run outlives
    its connection. The failure is logged with the run id and error class only."""

    def __init__(self, inner: EventSink, *, run_id: str) -> None:
        self.inner = inner
        self.run_id = run_id
        self.failures = 0

    async def emit(self, event: Event) -> None:
        try:
            await self.inner.emit(event)
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                logger.warning(
                    "event sink failed run=%s event=%s error=%s", self.run_id, event.type, type(exc).__name__
                )
