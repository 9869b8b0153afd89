"""The trace read model: one run's record aggregated at read time (`get_trace`).

`get_trace` turns a run into a `Trace` (run row, ordered timeline, steps, tools, reviews and a
`TraceSummary` from `audit.read.summary`) in seven queries whatever the run's size (one more for the
session row its chain binds, unless the caller joined it). It reads no
reasoning or assistant text: reasoning rows are read as stored, never decrypted, only to recompute their
digests. `assemble` builds the same `Trace` from rows read elsewhere (`audit.read.batches.iter_traces`).
The API and the admin's export render it with one serializer, so both give the same shape.
Details: docs/architecture.md, *The read side and reasoning governance*.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery, TextField
from django.db.models.functions import Cast

from audit.models import (
    AgentStep,
    Checkpoint,
    EventType,
    LogLeaf,
    RunReview,
    TailPending,
    ToolInvocation,
    TraceEvent,
)
from audit.read.summary import Counts, TraceSummary, summarize
from audit.verify import appended_rows
from audit.verify.chunk_reads import CompiledIds
from audit.verify.hash_chain import timestamp
from audit.verify.row_digests import stored_reasoning_rows
from audit.verify.rows import UNCHECKED
from core.compiled import CompiledQuery, RowsOfRun, json_loads
from core.db_router import LIVE, reads_from_replica
from diagnosis.models import (
    DEMO_PROVIDER,
    ChatSession,
    DiagnosisRun,
)
from diagnosis.selectors import FeedbackView, RunResolution, get_feedback, viewer_feedback
from pricing.costs import load_price_book, price_of_run
from pricing.rules import CallCost, PriceBook


@dataclass(frozen=True, slots=True)
class ProviderLabel:
    """The model provider a run used, as RUN_STARTED recorded it; `demo` marks the offline demo model."""

    name: str
    demo: bool


@dataclass(frozen=True, slots=True)
class ReviewView:
    """One human review of the run (`audit.RunReview`) as the trace shows it: `superseded` when a later
    review of the run exists (display only: every review is kept)."""

    review_id: str
    verdict: str
    note: str
    reviewer: str
    sequence_no: int
    created_at: dt.datetime
    superseded: bool


def review_views(reviews: Sequence[RunReview]) -> list[ReviewView]:
    """The run's reviews, oldest first; every one but the latest is superseded."""
    ordered = sorted(reviews, key=lambda r: r.sequence_no)
    return [
        ReviewView(
            review_id=r.review_id,
            verdict=r.verdict,
            note=r.note,
            reviewer=r.reviewer_username,
            sequence_no=r.sequence_no,
            created_at=r.created_at,
            superseded=i < len(ordered) - 1,
        )
        for i, r in enumerate(ordered)
    ]


@dataclass(frozen=True, slots=True)
class CallCostView:
    """One model call's cost by the pricing rule (`pricing.rules`) under the prices in force now, next to
    the usage record (`event`, MODEL_TOKEN_USAGE) it prices."""

    event: TraceEvent
    cost: CallCost


@dataclass(frozen=True, slots=True)
class Trace:
    session_id: str
    run_resolution: str
    run: DiagnosisRun
    feedback: FeedbackView | None
    timeline: list[StoredEvent]  # like TraceEvent rows (same attributes), read as stored
    steps: list[Any]  # every AgentStep column by attribute name
    tools: list[Any]  # every ToolInvocation column by attribute name
    summary: TraceSummary
    provider: ProviderLabel | None = None
    reviews: list[ReviewView] = field(default_factory=list)
    # Each model call's cost (usage records in timeline order); the run's stored cost is on `run`.
    call_costs: tuple[CallCostView, ...] = ()


class StoredEvent:
    """One timeline event as stored, read without a model instance: the `TraceEvent` fields under their
    names, `details` decoded, and `details_text`, the details column's text as stored (the canonical JSON
    the recorder hashed), which `audit.verify.hash_chain.verify_chain` checks the hash over first."""

    __slots__ = (
        "_created",
        "created_at",
        "details",
        "details_text",
        "event_type",
        "hash",
        "id",
        "phase",
        "prev_hash",
        "run_id",
        "sequence_no",
        "session_id",
        "status",
        "summary",
        "tag",
    )

    def __init__(self, *values: Any) -> None:
        (
            self.id,
            self.run_id,
            self.session_id,
            self.sequence_no,
            self.phase,
            self.event_type,
            self.status,
            self.summary,
            self.prev_hash,
            self.hash,
            self.created_at,
            self.tag,
            self.details_text,
        ) = values
        self.details = json_loads(self.details_text) if self.details_text is not None else None
        self._created = None

    def created_text(self) -> str:
        """`timestamp(created_at)`, the hashed form of the event's time, made once per value: the chain
        (`audit.verify.hash_chain`) and the body (`surfaces.api.trace_render`) both write it."""
        cached = self._created
        if cached is None or cached[0] is not self.created_at:
            cached = self._created = (self.created_at, timestamp(self.created_at))
        return cached[1]

    @property
    def pk(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"<StoredEvent {self.run_id}#{self.sequence_no} {self.event_type}>"


# The columns `timeline_of` reads, in `StoredEvent.__init__`'s order (the details text follows them).
_EVENT_VALUES = (
    "id",
    "run_id",
    "session_id",
    "sequence_no",
    "phase",
    "event_type",
    "status",
    "summary",
    "prev_hash",
    "hash",
    "created_at",
    "tag",
)


_TIMELINE = CompiledQuery(
    lambda run_id: (
        TraceEvent.objects.filter(run_id=run_id)
        .order_by("sequence_no")
        .annotate(details_text=Cast("details", output_field=TextField()))
        .values_list(*_EVENT_VALUES, "details_text")
    ),
    run_id=str,
)


_TIMELINES = CompiledIds(
    lambda run_ids: (
        TraceEvent.objects.filter(run_id__in=run_ids)
        .order_by("run_id", "sequence_no")
        .annotate(details_text=Cast("details", output_field=TextField()))
        .values_list(*_EVENT_VALUES, "details_text")
    )
)


def timeline_of(*, run_id: str) -> list[StoredEvent]:
    """The run's timeline in sequence order, one query (compiled once: `core.compiled`), no model
    instances (a long trace spent most of its read building them and decoding JSON through the field)."""
    return [StoredEvent(*row) for row in _TIMELINE.rows(run_id=run_id)]


def timelines_of(run_ids: list[str]) -> dict[str, list[StoredEvent]]:
    """The timelines of `run_ids` in sequence order, by run id (no model instances: what `timeline_of`
    reads for one run, for `verify_audit`'s chunks; compiled once per number of ids, `CompiledIds`)."""
    events: dict[str, list[StoredEvent]] = {}
    for _names, row in _TIMELINES.rows(run_ids):
        event = StoredEvent(*row)
        found = events.get(event.run_id)
        if found is None:
            events[event.run_id] = [event]
        else:
            found.append(event)
    return events


_STEPS_OF_RUN = RowsOfRun(AgentStep, ("id",))
_TOOLS_OF_RUN = RowsOfRun(ToolInvocation, ("started_at", "id"))
_REVIEWS_OF_RUN = RowsOfRun(RunReview, ("sequence_no",))


def provider_of(events: list[TraceEvent]) -> ProviderLabel | None:
    """The provider named by the run's RUN_STARTED event, or None when none is stored."""
    for event in events:
        if event.event_type == EventType.RUN_STARTED:
            name = (event.details or {}).get("provider")
            if isinstance(name, str) and name:
                return ProviderLabel(name=name, demo=name == DEMO_PROVIDER)
            return None
    return None


def written_with(*args: Any, run: DiagnosisRun, **kwargs: Any) -> Any:
    """What a read of `run`'s record depends on (`core.db_router`): a finished run's rows were all
    written by its `finished_at`; a run still running is read from the primary (`LIVE`)."""
    return run.finished_at if run.is_terminal and run.finished_at is not None else LIVE


@reads_from_replica(written_at=written_with)
def get_trace(
    *,
    run: DiagnosisRun,
    run_resolution: str = RunResolution.EXACT,
    viewer: AbstractBaseUser | None = None,
) -> Trace:
    """The trace of `run` (from the read replica when it is usable and shows the finished run:
    `core.db_router`). The viewer's feedback comes from the run's annotations
    (`diagnosis.selectors.get_visible_run(with_feedback=True)`), else from one query when `viewer` is
    given, else it is None."""
    events = timeline_of(run_id=run.run_id)
    # Every column of the step and tool rows: their digests cover them (`audit.verify.row_digests`).
    steps = _STEPS_OF_RUN(run.run_id)
    tools = _TOOLS_OF_RUN(run.run_id)
    reasoning = stored_reasoning_rows(run_id=run.run_id)
    reviews = _REVIEWS_OF_RUN(run.run_id)
    leaf, tails = anchored_leaves(run_id=run.run_id)
    book = load_price_book()  # the price overrides: one small query
    session = session_of(run)  # no query when the caller annotated or joined it

    if hasattr(run, "viewer_feedback_rating"):
        feedback = viewer_feedback(run)
    elif viewer is not None:
        feedback = get_feedback(run_id=run.run_id, user=viewer)
    else:
        feedback = None
    return assemble(
        run,
        run_resolution=run_resolution,
        feedback=feedback,
        events=events,
        steps=steps,
        tools=tools,
        reasoning=reasoning,
        reviews=reviews,
        leaf=leaf,
        tails=tails,
        book=book,
        session=session,
    )


def session_of(run: DiagnosisRun) -> Any | None:
    """The stored columns of `run`'s session that its chain binds (id, owner, creation time: form
    `session`), for the trace to verify: from `get_visible_run(with_session=True)`'s annotations or a
    session the caller's query joined (`select_related`), else one query; None when there is no row."""
    if hasattr(run, "session_owner_id"):
        return SimpleNamespace(
            session_id=run.session_id, owner_id=run.session_owner_id, created_at=run.session_created_at
        )
    if DiagnosisRun.session.is_cached(run):
        return run.session
    rows = ChatSession.objects.filter(session_id=run.session_id)
    found = rows.values("session_id", "owner_id", "created_at").first()
    return SimpleNamespace(**found) if found is not None else None


def assemble(
    run: DiagnosisRun,
    *,
    run_resolution: str,
    feedback: FeedbackView | None,
    events: list[TraceEvent],
    steps: list[AgentStep],
    tools: list[ToolInvocation],
    reasoning: list[dict],
    reviews: list[RunReview],
    leaf: LogLeaf | None,
    book: PriceBook,
    tails: Sequence[Any] = (),
    session: Any = UNCHECKED,
) -> Trace:
    session_id = run.session_id
    returned_events = [e for e in events if e.session_id == session_id]
    returned_steps = [s for s in steps if s.session_id == session_id]
    returned_tools = [t for t in tools if t.session_id == session_id]
    summary = summarize(
        run=run,
        events=events,
        persisted=Counts(len(events), len(steps), len(tools)),
        returned=Counts(len(returned_events), len(returned_steps), len(returned_tools)),
        tools=tools,
        steps=steps,
        reasoning=reasoning,
        reviews=reviews,
        leaf=leaf,
        tails=tails,
        appended=appended_rows.rows_of([run.run_id]).get(run.run_id, ()),
        session=session,
        tail_noted=bool(getattr(leaf, "tail_noted", False)) if leaf is not None else None,
    )
    return Trace(
        session_id=session_id,
        run_resolution=run_resolution,
        run=run,
        feedback=feedback,
        timeline=returned_events,
        steps=returned_steps,
        tools=returned_tools,
        summary=summary,
        provider=provider_of(events),
        reviews=review_views(reviews),
        call_costs=call_costs_of(run, returned_events, book=book),
    )


def call_costs_of(
    run: DiagnosisRun, events: list[TraceEvent], *, book: PriceBook
) -> tuple[CallCostView, ...]:
    """The cost of each usage record among `events` (`pricing.costs.price_of_run`)."""
    usage = [e for e in events if e.event_type == EventType.MODEL_TOKEN_USAGE]
    _run_cost, costs = price_of_run(run, [e.details or {} for e in usage], book=book)
    return tuple(CallCostView(event=e, cost=c) for e, c in zip(usage, costs, strict=True))


def anchored_leaf(*, run_id: str) -> Any | None:
    """The run's leaf in the transparency log (its columns by attribute name, not a model instance) with
    the first checkpoint that covers it annotated (`covering_hash`, `covering_size`,
    `covering_signed_at`; None when none does yet); one query. A run has at most one leaf (unique)."""
    return anchored_leaves(run_id=run_id)[0]


def anchored_leaves(*, run_id: str) -> tuple[Any | None, list[Any]]:
    """The run's leaf (as `anchored_leaf`) and its run-tail leaves in log order, in one query."""
    leaf, tails = None, []
    for found in _LEAF_OF_RUN(run_id):
        if found.tail_of is not None:
            tails.append(found)
        elif found.run_id == run_id:
            leaf = found
    return leaf, tails


def annotate_covering(leaves: QuerySet[LogLeaf]) -> QuerySet[LogLeaf]:
    """`leaves` with their first covering checkpoint (`covering_hash`, `covering_size`,
    `covering_signed_at`) and, on a run leaf, whether a tail note waits for its run (`tail_noted`)."""
    covering = Checkpoint.objects.filter(tree_size__gt=OuterRef("leaf_index")).order_by("tree_size")
    return leaves.annotate(
        covering_hash=Subquery(covering.values("checkpoint_hash")[:1]),
        covering_size=Subquery(covering.values("tree_size")[:1]),
        covering_signed_at=Subquery(covering.values("signed_at")[:1]),
        tail_noted=_TAIL_NOTED,
    )


_COVERING = Checkpoint.objects.filter(tree_size__gt=OuterRef("leaf_index")).order_by("tree_size")
# A run leaf's tail note (`audit.write.tail`): events appended after the newest anchored head without
# one would never be anchored (`audit.transparency.verify.check_anchor`). Read with the leaf, no query.
_TAIL_NOTED = Exists(TailPending.objects.filter(run_id=OuterRef("run_id")))
_LEAF_OF_RUN = RowsOfRun(
    LogLeaf,
    ("leaf_index",),
    match=lambda run_id: Q(run_id=run_id) | Q(tail_of=run_id),
    covering_hash=Subquery(_COVERING.values("checkpoint_hash")[:1]),
    covering_size=Subquery(_COVERING.values("tree_size")[:1]),
    covering_signed_at=Subquery(_COVERING.values("signed_at")[:1]),
    tail_noted=_TAIL_NOTED,
)
