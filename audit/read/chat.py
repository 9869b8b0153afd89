"""Chat replay: the stored timeline events a follower turns into frames (`chat_timeline`) and whether a
run's finish is stored (`finished_by`); read by `agent.runtime.live`. Only the events the chat maps to
frames and the outcome's columns of the run row are read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from audit.models import EventType, TraceEvent
from diagnosis.models import DiagnosisRun

_RUN_OUTCOME_FIELDS = (
    "run_id",
    "session_id",
    "status",
    "release_decision",
    "content",
    "error_code",
    "error_message",
    "query",
    "created_at",
)


@dataclass(frozen=True, slots=True)
class ChatTimelineRow:
    """One stored timeline event that maps to a chat frame (RUN_STARTED, TOOL_INVOCATION, RUN_FINISHED)."""

    sequence_no: int
    event_type: str
    status: str
    details: dict
    created_at: dt.datetime


def chat_timeline(
    *, run_id: str, after: int, event_types: Iterable[str]
) -> tuple[list[ChatTimelineRow], DiagnosisRun]:
    """The run's timeline events of `event_types` (the ones the chat maps to frames) with
    `sequence_no > after`, in order, then its row (only the outcome's columns). Two queries; the row is
    read second, so that a RUN_FINISHED seen in the first is normally matched by a terminal row. Raises
    `DiagnosisRun.DoesNotExist` for an unknown run."""
    rows = [
        ChatTimelineRow(*row)
        for row in TraceEvent.objects.filter(
            run_id=run_id, sequence_no__gt=after, event_type__in=list(event_types)
        )
        .order_by("sequence_no")
        .values_list("sequence_no", "event_type", "status", "details", "created_at")
    ]
    run = DiagnosisRun.objects.only(*_RUN_OUTCOME_FIELDS).get(run_id=run_id)
    return rows, run


def finished_by(*, run_id: str, sequence_no: int) -> bool:
    """Whether the run's RUN_FINISHED is stored at or before `sequence_no` (one query)."""
    return TraceEvent.objects.filter(
        run_id=run_id, sequence_no__lte=sequence_no, event_type=EventType.RUN_FINISHED
    ).exists()
