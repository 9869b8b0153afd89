"""What a run tells its live listeners: the chat frames of the API contract, and the sink they go to.

The pipeline reports to an `EventSink` (`async def emit(event)`); the transport decides where frames go.
The events are exactly the contract's chat frames and carry nothing else (no reasoning, tool input or
output, trace data): `RunEvent` first, `ProgressEvent`s, `ToolEvent`s, `DraftEvent`s only under the
`draft` policy, `ErrorEvent` for a failed run, and one `OutcomeEvent` last. A finished stage is exactly
one committed timeline event (`progress_of`), and events tied to a timeline event are emitted after it
committed with its `sequence_no`, so replay rebuilds exactly what the live stream sent.
Details: docs/runtime.md, *Live events (for the chat transport)*; docs/chat.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from audit.models import EventType

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunEvent:
    """Always the first event of a run: which session and run the client is following, whether the
    offline demo model answers it (`demo`: its answers are labelled DEMO), the question as stored
    (`query`: after secret redaction, so a page replaces what the reader pasted with what was kept) and
    when it was asked (`asked_at`, the run's creation: the origin of a replayed frame's `at`)."""

    session_id: str
    run_id: str
    sequence_no: int | None = None
    demo: bool = False
    query: str = ""
    asked_at: str | None = None
    type: ClassVar[str] = "run"


@dataclass(frozen=True, slots=True)
class DraftEvent:
    """A piece of unverified answer text as the provider streamed it (never reasoning); emitted only
    under the `draft` release policy."""

    run_id: str
    text: str
    type: ClassVar[str] = "draft"


class Stage:
    """The stages a `ProgressEvent` names (API contract, *Chat*)."""

    ROUTING = "ROUTING"
    MODEL_STEP = "MODEL_STEP"
    TOOL = "TOOL"
    EVIDENCE_GUARD = "EVIDENCE_GUARD"
    SEMANTIC_GUARD = "SEMANTIC_GUARD"
    RELEASE = "RELEASE"
    APPROVAL = "APPROVAL"
    REDACTION = "REDACTION"


STAGES = tuple(v for k, v in vars(Stage).items() if k.isupper())
STARTED = "STARTED"
FINISHED = "FINISHED"


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """What the run is doing: a `stage` that STARTED or FINISHED, with bounded, non-sensitive fields
    (None when not applicable): the routed intent, the model step's index and agent, a decision's
    verdict (TOOL_CALLS / ANSWER for a model step, PASS / FAIL / ERROR for guards, PUBLISHED / BLOCKED
    for the release), whether an evidence
    check is the repair round's. Never answer text, reasons or reasoning."""

    run_id: str
    stage: str
    status: str
    sequence_no: int | None = None
    intent: str | None = None
    step_index: int | None = None
    agent_name: str | None = None
    verdict: str | None = None
    retry: bool | None = None
    # REDACTION: kinds and counts of what was replaced before it was sent or stored (never a value).
    redacted: dict[str, int] | None = None
    # Replayed frames only: when the timeline event was recorded (`timestamp`); a live frame's time is
    # its arrival.
    at: str | None = None
    type: ClassVar[str] = "progress"


@dataclass(frozen=True, slots=True)
class ToolEvent:
    """A tool call changed status (RUNNING, then a terminal status); no input, no output."""

    run_id: str
    tool_call_id: str
    name: str
    status: str
    sequence_no: int | None = None
    at: str | None = None  # replayed frames only, as `ProgressEvent.at`
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


Event = RunEvent | ProgressEvent | DraftEvent | ToolEvent | OutcomeEvent | ErrorEvent
EVENT_TYPES: dict[str, type] = {
    cls.type: cls for cls in (RunEvent, ProgressEvent, DraftEvent, ToolEvent, OutcomeEvent, ErrorEvent)
}
# Events that correspond to a timeline event and carry its `sequence_no`.
SEQUENCED_TYPES = frozenset({"run", "progress", "tool", "outcome"})


def sequence_of(event: Event) -> int | None:
    """The timeline `sequence_no` an event carries (None for drafts, errors and started stages, or
    when unknown)."""
    return getattr(event, "sequence_no", None) if event.type in SEQUENCED_TYPES else None


def identity(event: Event) -> tuple | None:
    """The identity of an event within one run (None for drafts and started stages, which are never
    deduplicated): one `run`, one `outcome`, one `error`, one `tool` per call and status, and one
    finished stage per timeline event."""
    if isinstance(event, ToolEvent):
        return ("tool", event.tool_call_id, str(event.status))
    if isinstance(event, ProgressEvent):
        return ("progress", event.sequence_no) if event.sequence_no is not None else None
    if event.type in ("run", "outcome", "error"):
        return (event.type,)
    return None


# Timeline event type -> the stage it finishes. One home for the mapping: live (`progress_of` on what
# the recorder committed) and replay (`progress_of` on stored rows) cannot disagree.
_FINISHES: dict[str, str] = {
    EventType.ROUTING_DECISION: Stage.ROUTING,
    EventType.AGENT_MODEL_STEP: Stage.MODEL_STEP,
    EventType.EVIDENCE_GUARD_INITIAL: Stage.EVIDENCE_GUARD,
    EventType.EVIDENCE_GUARD_RETRY: Stage.EVIDENCE_GUARD,
    EventType.SEMANTIC_GUARD_DECISION: Stage.SEMANTIC_GUARD,
    EventType.RELEASE_DECISION: Stage.RELEASE,
    # A call waits for a person (verdict WAITING), then its decision (APPROVED / REJECTED / EXPIRED).
    EventType.APPROVAL_REQUESTED: Stage.APPROVAL,
    EventType.APPROVAL_DECIDED: Stage.APPROVAL,
    # Secrets were replaced (verdict APPLIED, with kinds and counts): the chat shows it before the answer.
    EventType.REDACTION_APPLIED: Stage.REDACTION,
}
# Every timeline event type a chat frame is made from (replay reads only these).
CHAT_TIMELINE_TYPES = frozenset(
    {EventType.RUN_STARTED, EventType.TOOL_INVOCATION, EventType.RUN_FINISHED, *_FINISHES}
)
# Statuses of those events that are not a stage finishing (a release withdrawn at a failed run's end).
_NOT_PROGRESS_STATUSES = frozenset({"WITHDRAWN"})


def timestamp(value: dt.datetime | None) -> str | None:
    """A frame's time: ISO 8601 in UTC to the millisecond (`2026-01-02T03:04:05.678Z`), or None."""
    if value is None:
        return None
    return value.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def run_event(run: Any, *, sequence_no: int | None, demo: bool) -> RunEvent:
    """The `run` frame of a run's row, live and replayed alike: its ids, the question as stored (redacted
    before the run was created) and when it was asked."""
    return RunEvent(
        session_id=run.session_id,
        run_id=run.run_id,
        sequence_no=sequence_no,
        demo=demo,
        query=run.query,
        asked_at=timestamp(run.created_at),
    )


def progress_of(
    *,
    run_id: str,
    event_type: str,
    status: str,
    details: dict[str, Any],
    sequence_no: int | None,
    at: str | None = None,
) -> ProgressEvent | None:
    """The FINISHED progress event of a committed timeline event, or None when it finishes no stage
    (`at`: when it was recorded, given by the replay)."""
    stage = _FINISHES.get(str(event_type))
    if stage is None or str(status) in _NOT_PROGRESS_STATUSES:
        return None
    details = details or {}
    fields: dict[str, Any] = {}
    if stage == Stage.ROUTING:
        fields["intent"] = _bounded(details.get("intent"))
    elif stage == Stage.MODEL_STEP:
        step = details.get("stepIndex")
        fields["step_index"] = step if isinstance(step, int) else None
        fields["agent_name"] = _bounded(details.get("agentName"))
        fields["verdict"] = _bounded(status)  # TOOL_CALLS or ANSWER
    else:
        fields["verdict"] = _bounded(status)
        if stage == Stage.EVIDENCE_GUARD:
            fields["retry"] = str(event_type) == EventType.EVIDENCE_GUARD_RETRY
        elif stage == Stage.REDACTION:
            counts = details.get("counts") if isinstance(details.get("counts"), dict) else {}
            fields["redacted"] = {
                str(k)[:32]: v for k, v in list(counts.items())[:20] if isinstance(v, int) and v > 0
            }
    return ProgressEvent(
        run_id=run_id, stage=stage, status=FINISHED, sequence_no=sequence_no, at=at, **fields
    )


def _bounded(value: Any) -> str | None:
    return None if value is None else str(value)[:32]


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
        # Awaited before every frame (the executor's: commit the run's held decisions first, so that
        # nothing leaves the process before the decisions recorded so far are durable).
        self.before_emit: Callable[[], Awaitable[None]] | None = None

    async def emit(self, event: Event) -> None:
        if self.before_emit is not None:
            await self.before_emit()
        try:
            await self.inner.emit(event)
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                logger.warning(
                    "event sink failed run=%s event=%s error=%s", self.run_id, event.type, type(exc).__name__
                )
