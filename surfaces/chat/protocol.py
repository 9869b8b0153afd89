"""The chat protocol: every frame of the API contract's *Chat* section, defined once, encoded for the
WebSocket and for Server-Sent Events.

A frame is a run event (`agent.runtime.events`); `_PAYLOAD` states each frame type's keys and sources
once. `ws_frame` adds `runId` to frames whose payload does not name the run (a socket may follow
several); `sse_message` writes `event:`, one line of JSON `data:` and the timeline `id:` when known.
Frames carry nothing else: no reasoning, no tool input or output, no trace data. A refused request is
`ChatRefused`: an `error` frame on the WebSocket, the contract's JSON error before an SSE stream.
Details: docs/chat.md, *Frames*.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agent.runtime.events import ErrorEvent, Event, sequence_of
from surfaces.answers import render_answer

RETRY_MS = 3000
SSE_RETRY = f"retry: {RETRY_MS}\n\n".encode()
SSE_KEEP_ALIVE = b": keep-alive\n\n"


class ChatRefused(Exception):
    """A chat, attach or cancel request the transport must refuse: `code` and a safe `message` for the
    contract's error shape, the HTTP `status` an SSE endpoint answers with, and for a throttled start the
    seconds to wait (`retry_after`, the SSE `Retry-After` header)."""

    def __init__(self, status: int, code: str, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


_PAYLOAD: dict[str, Callable[[Any], dict[str, Any]]] = {
    "run": lambda e: {
        "sessionId": e.session_id,
        "runId": e.run_id,
        "demo": e.demo,
        "query": e.query,
        "askedAt": e.asked_at,
    },
    "progress": lambda e: _progress_payload(e),
    "draft": lambda e: {"text": e.text},
    "tool": lambda e: {
        "toolCallId": e.tool_call_id,
        "name": e.name,
        "status": str(e.status),
        **({"at": e.at} if e.at is not None else {}),
    },
    "outcome": lambda e: {
        "runId": e.run_id,
        "status": str(e.status),
        "releaseDecision": str(e.release_decision) if e.release_decision else None,
        "content": e.content,
        "contentHtml": str(render_answer(e.content)),
    },
    "error": lambda e: {"code": e.code, "message": e.message},
}
# Frame types whose payload does not name the run; a WebSocket frame adds `runId` to them.
_ADDRESSED_ON_WEBSOCKET = frozenset({"progress", "draft", "tool"})
FRAME_TYPES = frozenset(_PAYLOAD)
# ProgressEvent attribute -> frame key, for the optional fields (sent only when they apply).
_PROGRESS_FIELDS = (
    ("intent", "intent"),
    ("step_index", "stepIndex"),
    ("agent_name", "agentName"),
    ("verdict", "verdict"),
    ("retry", "retry"),
    ("redacted", "redacted"),
    ("at", "at"),
)


def _progress_payload(e: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"stage": e.stage, "status": e.status, "sequenceNo": e.sequence_no}
    for attr, key in _PROGRESS_FIELDS:
        value = getattr(e, attr)
        if value is not None:
            out[key] = value
    return out


def payload(event: Event) -> dict[str, Any]:
    """The frame's contract keys without `type` (the SSE `data:` object)."""
    return _PAYLOAD[event.type](event)


def ws_frame(event: Event) -> dict[str, Any]:
    """The WebSocket frame of an event: `type`, `runId` where the payload lacks it, then the payload."""
    frame: dict[str, Any] = {"type": event.type}
    if event.type in _ADDRESSED_ON_WEBSOCKET:
        frame["runId"] = event.run_id
    frame.update(payload(event))
    return frame


def error_frame(*, code: str, message: str) -> dict[str, Any]:
    """The WebSocket `error` frame of a refused request (no run)."""
    return ws_frame(ErrorEvent(code=code, message=message))


def to_json(value: dict[str, Any]) -> str:
    """Compact JSON, non-ASCII kept as is (WebSocket text frames and SSE `data:` lines)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sse_message(event: Event) -> bytes:
    """One SSE message: `id:` (when the event has a sequence number), `event:` and `data:`."""
    lines = []
    seq = sequence_of(event)
    if seq is not None:
        lines.append(f"id: {seq}")
    lines.append(f"event: {event.type}")
    lines.append("data: " + to_json(payload(event)))
    return ("\n".join(lines) + "\n\n").encode("utf-8")
