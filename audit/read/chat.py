"""Chat replay: the stored timeline events a follower turns into frames (`chat_timeline`) and whether a
run's finish is stored (`finished_by`); read by `agent.runtime.live`. Only the events the chat maps to
frames and the outcome's columns of the run row are read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from audit.models import EventType, TraceEvent
from core.compiled import CompiledQuery
from core.db_router import read_alias
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
    `sequence_no > after`, in order, then its row (only the outcome's columns). Two queries, each
    compiled once (a follower asks at every sequence gap of a live run); the row is read second, so that
    a RUN_FINISHED seen in the first is normally matched by a terminal row. Raises
    `DiagnosisRun.DoesNotExist` for an unknown run."""
    alias = read_alias()
    kinds = frozenset(event_types)
    query = _EVENTS.get(kinds) or _EVENTS.setdefault(kinds, _events_query(kinds))
    rows = [ChatTimelineRow(*row) for row in query.rows(alias, run_id=run_id, after=after)]
    found = _RUN_OUTCOME.rows(alias, run_id=run_id)
    if not found:
        raise DiagnosisRun.DoesNotExist("DiagnosisRun matching query does not exist.")
    return rows, DiagnosisRun.from_db(alias, _RUN_COLUMNS, found[0])


def finished_by(*, run_id: str, sequence_no: int) -> bool:
    """Whether the run's RUN_FINISHED is stored at or before `sequence_no` (one query)."""
    return bool(_FINISHED_BY.rows(run_id=run_id, sequence_no=sequence_no))


def _events_query(kinds: frozenset[str]) -> CompiledQuery:
    return CompiledQuery(
        lambda run_id, after: (
            TraceEvent.objects.filter(run_id=run_id, sequence_no__gt=after, event_type__in=sorted(kinds))
            .order_by("sequence_no")
            .values_list("sequence_no", "event_type", "status", "details", "created_at")
        ),
        run_id=str,
        after=int,
    )


# By the set of event types asked for (the chat asks for one).
_EVENTS: dict[frozenset[str], CompiledQuery] = {}
# The outcome's columns and the key (as `only()` reads them) in the model's order, which is how
# `Model.from_db` takes a subset of its columns.
_RUN_COLUMNS = tuple(
    f.attname for f in DiagnosisRun._meta.concrete_fields if f.primary_key or f.attname in _RUN_OUTCOME_FIELDS
)
_RUN_OUTCOME = CompiledQuery(
    lambda run_id: DiagnosisRun.objects.filter(run_id=run_id).values_list(*_RUN_COLUMNS), run_id=str
)
_FINISHED_BY = CompiledQuery(
    lambda run_id, sequence_no: TraceEvent.objects.filter(
        run_id=run_id, sequence_no__lte=sequence_no, event_type=EventType.RUN_FINISHED
    ).values_list("pk")[:1],
    run_id=str,
    sequence_no=int,
)
