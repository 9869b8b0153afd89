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

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

logger = logging.getLogger(__name__)


class _Frame:
    type: ClassVar[str]

    def sse_data(self) -> dict[str, Any]:  # pragma: no cover - every event overrides it
        raise NotImplementedError

    def ws_frame(self) -> dict[str, Any]:
        """The WebSocket frame: `{"type": ..., **fields}` as the contract lists them."""
        return {"type": self.type, **self.sse_data()}


@dataclass(frozen=True, slots=True)
class RunEvent(_Frame):
    """Always the first event of a run: which session and run the client is following."""

    session_id: str
    run_id: str
    sequence_no: int | None = None
    type: ClassVar[str] = "run"

    def sse_data(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "runId": self.run_id}


@dataclass(frozen=True, slots=True)
class DeltaEvent(_Frame):
    """A piece of visible answer text as the provider streamed it (never reasoning)."""

    run_id: str
    text: str
    type: ClassVar[str] = "delta"

    def sse_data(self) -> dict[str, Any]:
        return {"text": self.text}

    def ws_frame(self) -> dict[str, Any]:
        return {"type": self.type, "runId": self.run_id, "text": self.text}


@dataclass(frozen=True, slots=True)
class ToolEvent(_Frame):
    """A tool call changed status (RUNNING, then a terminal status); no input, no output."""

    run_id: str
    tool_call_id: str
    name: str
    status: str
    sequence_no: int | None = None
    type: ClassVar[str] = "tool"

    def sse_data(self) -> dict[str, Any]:
        return {"toolCallId": self.tool_call_id, "name": self.name, "status": self.status}

    def ws_frame(self) -> dict[str, Any]:
        return {"type": self.type, "runId": self.run_id, **self.sse_data()}


@dataclass(frozen=True, slots=True)
class OutcomeEvent(_Frame):
    """The last event of a finished run: status, release decision and the released content."""

    run_id: str
    status: str
    release_decision: str | None
    content: str
    sequence_no: int | None = None
    type: ClassVar[str] = "outcome"

    def sse_data(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "status": self.status,
            "releaseDecision": self.release_decision,
            "content": self.content,
        }


@dataclass(frozen=True, slots=True)
class ErrorEvent(_Frame):
    """A failed run's error code and safe message (sent before its outcome). `run_id` is for routing
    only and is not part of the frame."""

    code: str
    message: str
    run_id: str = ""
    type: ClassVar[str] = "error"

    def sse_data(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}


Event = RunEvent | DeltaEvent | ToolEvent | OutcomeEvent | ErrorEvent


@runtime_checkable
class EventSink(Protocol):
    """Where a run's live events go. `emit` should not block for long; it is awaited in order."""

    async def emit(self, event: Event) -> None: ...


class NullSink:
    """Drops every event (runs started without a listener, e.g. demo data)."""

    async def emit(self, event: Event) -> None:
        return None


class CollectingSink:
    """Keeps every event in order (`events`); handy for callers that want the frames afterwards."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    def of_type(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


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
