"""The trace read model: one run's record aggregated at read time, and a session's newest audit records.

`get_trace` turns a run into a `Trace`: the run row (with the viewer's feedback), its ordered timeline,
its model steps and its tool invocations, and a `TraceSummary` that compares what is stored with what the
recorder expected to write, and every stored row with the digest its chain carries, so that an
incomplete or altered audit is visible and never silent (seed 001, sections 6–8). It costs seven queries
whatever the run's size (events, steps, tools, the reasoning rows' stored columns, the run's reviews, its
leaf in the transparency log and the price overrides; plus one for the feedback only when the caller did
not annotate it on the run). No reasoning or assistant text is read: the reasoning rows
(`reasoning.AgentReasoningAudit`) are read as stored, ciphertext cast to plain text and never decrypted,
only to recompute their digests; nothing of them enters the trace.

The API (`audit.apis.TraceApi`) and the admin's "export as JSON" both call `get_trace` and render it with
`audit.serializers.TraceSerializer`, so both produce the same shape.

Summary semantics (documented in docs/api.md):

* `persisted`: rows stored under the run's id; `expected`: what the recorder attempted, as its chain
  records it (`RUN_FINISHED`'s counts plus governance events; before the finish, the events
  themselves; the run's `expected_*` columns for runs recorded before row digests or whose finish is
  not in the chain); `returned`: rows in this response — the persisted rows whose `session_id` is the
  run's session (a row stored under the run's id but another session is excluded and named in `gaps`).
* `chainValid`: `audit.integrity.verify_chain` over every persisted event (1..n without gap or repeat,
  each `prev_hash` the previous `hash`, each hash recomputed from its own fields).
* `rowsVerified` is true when every stored row of the run (steps, tools, reasoning rows, the run's
  terminal summary) carries a digest in the chain and matches it when recomputed from its stored columns
  (`audit.binding.verify_rows`), no bound row is missing, and a finished run's chain holds its
  RUN_FINISHED; `rowsVerifiedCount` is how many rows matched (rows recorded before row digests are not
  bound: they make `rowsVerified` false without making the audit incomplete).
* `auditComplete` is true exactly when the run is terminal (SUCCESS, FAILED, CANCELLED), persisted equals
  expected for events, steps, tools (and reasoning rows), returned equals persisted,
  `auditWriteFailures` is 0, the chain is valid, every bound row matches its digest and no tool of the
  finished run is still RUNNING.
* `gaps` names, in words and without content, every reason `auditComplete` is false, and also what the
  provider did not supply (model calls without token usage, an unreconciled token ledger), each tool
  lifecycle step the recorder refused (a conflicting start or terminal: its CONFLICT event), rows
  recorded before row digests ("not bound") and reasoning purged by governance. Those notes alone do not
  make the audit incomplete: the audit recorded faithfully what happened.
* `anchor`: where the run is anchored in the transparency log (its leaf index and the first checkpoint
  covering it: its hash, tree size and signing time), or null when no checkpoint covers it yet. When the
  run is anchored, its stored chain must still have the head its leaf committed to (a run rewritten
  and re-hashed after anchoring, or events other than governance after the anchored head): otherwise
  `gaps` names it and the audit is incomplete (`audit.transparency.verify.check_anchor`).
* `fencedWrites`: writes of a stale lease owner (one that another process took the run from) that the
  lease fence refused; none of their rows is stored, so they do not make the audit incomplete, and
  `gaps` names them.
* `ledger` is the token reconciliation at read time (`audit.reconcile`) over the rows already loaded: the
  stored usage events and step rows against the run's ledger columns and its `model_calls` (counted as
  calls start). It names each call whose records differ or that lacks usage; the run's `reconciled` is
  this verdict and the one the recorder wrote at finish.
* A FAILED or CANCELLED run never carries a release decision or content (the recorder withdraws one
  recorded before the failure); a stored row that does is named in `gaps` and the audit is incomplete.
* `Trace.provider` is the provider recorded at RUN_STARTED; `demo` is true for the offline demo model,
  whose text and reasoning are not a real model's.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import (
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
)
from django.db.models.functions import Cast

from audit.binding import verify_rows
from audit.chunks import run_chunks
from audit.integrity import verify_chain
from audit.models import (
    TOOL_CONFLICT,
    AgentStep,
    Checkpoint,
    EventType,
    LogLeaf,
    RunReview,
    ToolInvocation,
    ToolStatus,
    TraceEvent,
)
from audit.reconcile import CallUsage, KeptLedger, Reconciliation, reconcile, usage_counts
from audit.rowdigest import stored_reasoning_rows
from audit.transparency.verify import check_anchor
from core.compiled import CompiledQuery, json_loads
from diagnosis.models import DiagnosisRun, RunStatus
from diagnosis.selectors import FeedbackView, RunResolution, feedback_of, get_feedback, viewer_feedback
from pricing.costs import load_price_book, price_of_run
from pricing.rules import CallCost, PriceBook

SESSION_AUDITS_LIMIT = 500

# agent_step columns the trace never shows (bounded metadata, but not part of the contract)
_STEP_DEFERRED = ("model_input", "model_output", "attempts", "tool_call_ids")


@dataclass(frozen=True, slots=True)
class Counts:
    events: int
    steps: int
    tools: int


@dataclass(frozen=True, slots=True)
class AnchorView:
    """Where a run is anchored in the transparency log: its leaf and the first checkpoint covering it."""

    checkpoint: str  # that checkpoint's hash
    tree_size: int
    leaf_index: int
    signed_at: dt.datetime


@dataclass(frozen=True, slots=True)
class TraceSummary:
    persisted: Counts
    expected: Counts
    returned: Counts
    audit_complete: bool
    audit_write_failures: int
    chain_valid: bool
    gaps: list[str] = field(default_factory=list)
    fenced_writes: int = 0
    ledger: Reconciliation | None = None
    rows_verified: bool = False
    rows_verified_count: int = 0
    anchor: AnchorView | None = None


DEMO_PROVIDER = "demo"


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
    the recorder hashed), which `audit.integrity.verify_chain` checks the hash over first."""

    __slots__ = (
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
            self.details_text,
        ) = values
        self.details = json_loads(self.details_text) if self.details_text is not None else None

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


def timeline_of(*, run_id: str) -> list[StoredEvent]:
    """The run's timeline in sequence order, one query (compiled once: `core.compiled`), no model
    instances (a long trace spent most of its read building them and decoding JSON through the field)."""
    return [StoredEvent(*row) for row in _TIMELINE.rows(run_id=run_id)]


class _RowsOfRun:
    """The rows of `model` stored under one run id, in `order`, as attribute bags of every concrete
    column under its attribute name (the digests cover every column) and `pk`, without model instances;
    one query compiled once (`core.compiled`), with `annotations` (name → expression) added."""

    def __init__(self, model, order: Sequence[str], *, match=None, **annotations: Any) -> None:
        self._pk = model._meta.pk.attname
        match = match or (lambda run_id: Q(run_id=run_id))
        self._query = CompiledQuery(
            lambda run_id: model.objects.filter(match(run_id)).order_by(*order).annotate(**annotations),
            run_id=str,
        )

    def __call__(self, run_id: str) -> list[SimpleNamespace]:
        names = self._query.names()
        pk = names.index(self._pk)
        return [
            SimpleNamespace(pk=row[pk], **dict(zip(names, row, strict=True)))
            for row in self._query.rows(run_id=run_id)
        ]


_STEPS_OF_RUN = _RowsOfRun(AgentStep, ("id",))
_TOOLS_OF_RUN = _RowsOfRun(ToolInvocation, ("started_at", "id"))
_REVIEWS_OF_RUN = _RowsOfRun(RunReview, ("sequence_no",))


def provider_of(events: list[TraceEvent]) -> ProviderLabel | None:
    """The provider named by the run's RUN_STARTED event, or None when none is stored."""
    for event in events:
        if event.event_type == EventType.RUN_STARTED:
            name = (event.details or {}).get("provider")
            if isinstance(name, str) and name:
                return ProviderLabel(name=name, demo=name == DEMO_PROVIDER)
            return None
    return None


def get_trace(
    *,
    run: DiagnosisRun,
    run_resolution: str = RunResolution.EXACT,
    viewer: AbstractBaseUser | None = None,
) -> Trace:
    """The trace of `run`. The viewer's feedback comes from the run's annotations
    (`diagnosis.selectors.get_visible_run(with_feedback=True)`), else from one query when `viewer` is
    given, else it is None."""
    events = timeline_of(run_id=run.run_id)
    # Every column of the step and tool rows: their digests cover them (`audit.rowdigest`).
    steps = _STEPS_OF_RUN(run.run_id)
    tools = _TOOLS_OF_RUN(run.run_id)
    reasoning = stored_reasoning_rows(run_id=run.run_id)
    reviews = _REVIEWS_OF_RUN(run.run_id)
    leaf, tails = anchored_leaves(run_id=run.run_id)
    book = load_price_book()  # the price overrides: one small query

    if hasattr(run, "viewer_feedback_rating"):
        feedback = viewer_feedback(run)
    elif viewer is not None:
        feedback = get_feedback(run_id=run.run_id, user=viewer)
    else:
        feedback = None
    return _assemble(
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
    )


def _assemble(
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


EXPORT_CHUNK = 200


def iter_traces(
    runs: QuerySet[DiagnosisRun], *, viewer: AbstractBaseUser | None = None, chunk: int = EXPORT_CHUNK
) -> Iterator[Trace]:
    """The trace of each run of `runs`, in primary-key order, `chunk` runs at a time: per chunk one
    query each for the runs, their events, steps, tools, reasoning rows' stored columns, reviews, leaves
    and (with a `viewer`) the viewer's feedback, so memory holds one chunk whatever the number of runs
    (`manage.py export_traces`, the admin's export). Each trace equals `get_trace(run=run, viewer=viewer)`."""
    book = load_price_book()
    for batch, events in run_chunks(runs, chunk):
        ids = [r.run_id for r in batch]
        steps: dict[str, list[AgentStep]] = defaultdict(list)
        for st in AgentStep.objects.filter(run_id__in=ids).order_by("run_id", "id"):
            steps[st.run_id].append(st)
        tools: dict[str, list[ToolInvocation]] = defaultdict(list)
        for t in ToolInvocation.objects.filter(run_id__in=ids).order_by("run_id", "started_at", "id"):
            tools[t.run_id].append(t)
        reasoning: dict[str, list[dict]] = defaultdict(list)
        for row in stored_reasoning_rows(run_id__in=ids):
            reasoning[row["run_id"]].append(row)
        reviews: dict[str, list[RunReview]] = defaultdict(list)
        for review in RunReview.objects.filter(run_id__in=ids).order_by("run_id", "sequence_no"):
            reviews[review.run_id].append(review)
        leaves, tails = {}, defaultdict(list)
        for lf in _anchored_leaves(LogLeaf.objects.filter(Q(run_id__in=ids) | Q(tail_of__in=ids))):
            if lf.tail_of is not None:
                tails[lf.tail_of].append(lf)
            elif lf.run_id is not None:
                leaves[lf.run_id] = lf
        feedback = feedback_of(run_ids=ids, user=viewer) if viewer is not None else {}
        for run in batch:
            yield _assemble(
                run,
                run_resolution=RunResolution.EXACT,
                feedback=feedback.get(run.run_id),
                events=events.pop(run.run_id, []),
                steps=steps.pop(run.run_id, []),
                tools=tools.pop(run.run_id, []),
                reasoning=reasoning.pop(run.run_id, []),
                reviews=reviews.pop(run.run_id, []),
                leaf=leaves.get(run.run_id),
                tails=tails.get(run.run_id, ()),
                book=book,
            )


def call_costs_of(
    run: DiagnosisRun, events: list[TraceEvent], *, book: PriceBook
) -> tuple[CallCostView, ...]:
    """The cost of each usage record among `events` (`pricing.costs.price_of_run`)."""
    usage = [e for e in events if e.event_type == EventType.MODEL_TOKEN_USAGE]
    _run_cost, costs = price_of_run(run, [e.details or {} for e in usage], book=book)
    return tuple(CallCostView(event=e, cost=c) for e, c in zip(usage, costs, strict=True))


_LABELS = {"events": "timeline event", "steps": "model step", "tools": "tool invocation"}


def _n(count: int, label: str) -> str:
    return f"{count} {label}{'' if count == 1 else 's'}"


_CONFLICT_WORDS = {
    "CONFLICTING_START": "a start with other facts",
    "CONFLICTING_TERMINAL": "a terminal with other facts",
    "NOT_STARTED": "a terminal without a start",
}


def _conflict_gap(details: dict) -> str:
    words = _CONFLICT_WORDS.get(str(details.get("reason")), "a conflicting lifecycle step")
    return f"tool call {details.get('toolCallId')}: {words} was refused"


def summarize(
    *,
    run: DiagnosisRun,
    events: list[TraceEvent],
    persisted: Counts,
    returned: Counts,
    tools: list[ToolInvocation],
    steps: Sequence[AgentStep] = (),
    reasoning: Sequence[dict] = (),
    reviews: Sequence[RunReview] = (),
    leaf: LogLeaf | None = None,
    tails: Sequence[Any] = (),
) -> TraceSummary:
    """Compare stored, expected and returned records of `run`, and every stored row with its digest in
    the chain, and the chain with every head anchored for it in the transparency log; see the module
    docstring. `reasoning`: the run's reasoning rows as stored (`audit.rowdigest.stored_reasoning_rows`);
    `leaf` and `tails`: the run's leaf and run-tail leaves as `anchored_leaves` reads them (None, (): not
    anchored)."""
    rows = verify_rows(events=events, run=run, steps=steps, tools=tools, reasoning=reasoning, reviews=reviews)
    if rows.expected is not None:
        expected = Counts(rows.expected.events, rows.expected.steps, rows.expected.tools)
    else:
        expected = Counts(run.expected_events, run.expected_steps, run.expected_tools)
    terminal = run.is_terminal
    gaps: list[str] = []
    complete = True

    if not terminal:
        complete = False
        gaps.append(f"run still {run.status}")

    for kind, label in _LABELS.items():
        stored, wanted, shown = getattr(persisted, kind), getattr(expected, kind), getattr(returned, kind)
        if stored < wanted:
            complete = False
            gaps.append(f"{_n(wanted - stored, label)} expected but not stored")
        elif stored > wanted and terminal:
            # A finished run's counts are final; more rows than attempted means the counts were not saved.
            complete = False
            gaps.append(f"{_n(stored - wanted, label)} stored beyond the {wanted} expected")
        if shown < stored:
            complete = False
            gaps.append(f"{_n(stored - shown, label)} stored under this run but another session")
    wanted = rows.expected.reasoning if rows.expected is not None else None
    if wanted is not None and terminal and len(reasoning) != wanted:
        complete = False
        if len(reasoning) < wanted:
            gaps.append(f"{_n(wanted - len(reasoning), 'reasoning row')} expected but not stored")
        else:
            gaps.append(f"{_n(len(reasoning) - wanted, 'reasoning row')} stored beyond the {wanted} expected")

    if run.audit_write_failures:
        complete = False
        gaps.append(f"{_n(run.audit_write_failures, 'audit write failure')} recorded")

    verdict = verify_chain(events)
    if not verdict.valid:
        complete = False
        gaps.extend(f"hash chain: {problem}" for problem in verdict.problems)
    if rows.problems:
        complete = False
        gaps.extend(rows.problems)
    if rows.unfinished:
        complete = False
        gaps.append(rows.unfinished)
    gaps.extend(rows.notes)

    if terminal:
        for tool in tools:
            if tool.status == ToolStatus.RUNNING:
                complete = False
                gaps.append(f"tool call {tool.tool_call_id} still RUNNING after the run ended")

    anchor_problems, _ = check_anchor(run=run, events=events, leaf=leaf, tails=tails)
    if anchor_problems:
        complete = False
        gaps.extend(f"transparency log: {problem}" for problem in anchor_problems)

    if run.status in (RunStatus.FAILED, RunStatus.CANCELLED) and (run.release_decision or run.content):
        complete = False
        gaps.append(
            f"run {run.status} carries "
            + (f"release {run.release_decision}" if run.release_decision else "released content")
        )

    # Refused tool lifecycle steps: recorded faithfully (the first facts stand), named, not incomplete.
    for event in events:
        if event.event_type == EventType.TOOL_INVOCATION and event.status == TOOL_CONFLICT:
            gaps.append(_conflict_gap(event.details or {}))

    # Provider-side facts: named, but they do not make the audit itself incomplete.
    ledger = reconcile_trace(run=run, events=events, steps=steps)
    gaps.extend(ledger.notes())
    if terminal and not ledger.reconciled and not ledger.without_usage and not ledger.differences:
        gaps.append("token ledger not reconciled when the run finished")
    # Refused, not lost: a previous lease owner's writes after the takeover, none of them stored.
    if run.fenced_writes:
        gaps.append(f"{_n(run.fenced_writes, 'write')} of a previous lease owner refused by the lease fence")

    return TraceSummary(
        persisted=persisted,
        expected=expected,
        returned=returned,
        audit_complete=complete,
        audit_write_failures=run.audit_write_failures,
        chain_valid=verdict.valid,
        gaps=gaps,
        fenced_writes=run.fenced_writes,
        ledger=ledger,
        rows_verified=rows.all_verified,
        rows_verified_count=rows.verified,
        anchor=_anchor_view(leaf),
    )


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


def _anchored_leaves(leaves: QuerySet[LogLeaf]) -> QuerySet[LogLeaf]:
    covering = Checkpoint.objects.filter(tree_size__gt=OuterRef("leaf_index")).order_by("tree_size")
    return leaves.annotate(
        covering_hash=Subquery(covering.values("checkpoint_hash")[:1]),
        covering_size=Subquery(covering.values("tree_size")[:1]),
        covering_signed_at=Subquery(covering.values("signed_at")[:1]),
    )


_COVERING = Checkpoint.objects.filter(tree_size__gt=OuterRef("leaf_index")).order_by("tree_size")
_LEAF_OF_RUN = _RowsOfRun(
    LogLeaf,
    ("leaf_index",),
    match=lambda run_id: Q(run_id=run_id) | Q(tail_of=run_id),
    covering_hash=Subquery(_COVERING.values("checkpoint_hash")[:1]),
    covering_size=Subquery(_COVERING.values("tree_size")[:1]),
    covering_signed_at=Subquery(_COVERING.values("signed_at")[:1]),
)


def _anchor_view(leaf: LogLeaf | None) -> AnchorView | None:
    if leaf is None or getattr(leaf, "covering_hash", None) is None:
        return None
    return AnchorView(
        checkpoint=leaf.covering_hash,
        tree_size=int(leaf.covering_size),
        leaf_index=leaf.leaf_index,
        signed_at=leaf.covering_signed_at,
    )


def reconcile_trace(*, run: DiagnosisRun, events: list[TraceEvent], steps: list[AgentStep]) -> Reconciliation:
    """The run's token reconciliation from rows already loaded (no query). Before the run is terminal
    its ledger columns are not written yet, so only the stored records are compared with each other."""
    stored = [
        CallUsage.from_details(e.details or {}) for e in events if e.event_type == EventType.MODEL_TOKEN_USAGE
    ]
    step_usage = [
        (
            s.step_index,
            CallUsage(
                "AGENT", s.step_index, bool(s.usage_available), **usage_counts(s), agent_name=s.agent_name
            ),
        )
        for s in steps
    ]
    if not run.is_terminal:
        verdict = reconcile(stored=stored, steps=step_usage)
        return replace(verdict, reconciled=False)
    kept = KeptLedger(
        by_source={"ROUTER": run.tokens_router, "AGENT": run.tokens_agent, "GUARD": run.tokens_guard},
        total=run.tokens_total,
        reasoning=run.tokens_reasoning,
        cached_input=run.tokens_cached_input,
        model_calls=run.model_calls,
        unavailable_calls=run.usage_unavailable_calls,
    )
    verdict = reconcile(stored=stored, steps=step_usage, started_calls=run.model_calls, kept=kept)
    return replace(verdict, reconciled=verdict.reconciled and bool(run.tokens_reconciled))


# --------------------------------------------------------------------------------------------------
# Session audits
# --------------------------------------------------------------------------------------------------
class AuditKind:
    MODEL_STEP = "MODEL_STEP"
    TOOL = "TOOL"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One model-step or tool record of a session; exactly one of `step` and `tool` is set."""

    kind: str
    run_id: str
    created_at: dt.datetime
    step: AgentStep | None = None
    tool: ToolInvocation | None = None


@dataclass(frozen=True, slots=True)
class SessionAudits:
    audits: list[AuditRecord]
    truncated: bool


def get_session_audits(*, session_id: str, limit: int = SESSION_AUDITS_LIMIT) -> SessionAudits:
    """The newest `limit` model-step and tool records across the session's runs, oldest first; two
    queries. `truncated` is true when the session holds more than `limit` such records."""
    steps = list(
        AgentStep.objects.filter(session_id=session_id)
        .defer(*_STEP_DEFERRED)
        .order_by("-created_at", "-id")[: limit + 1]
    )
    tools = list(
        ToolInvocation.objects.filter(session_id=session_id).order_by("-created_at", "-id")[: limit + 1]
    )
    records = [AuditRecord(AuditKind.MODEL_STEP, s.run_id, s.created_at, step=s) for s in steps] + [
        AuditRecord(AuditKind.TOOL, t.run_id, t.created_at, tool=t) for t in tools
    ]
    records.sort(key=lambda r: (r.created_at, r.kind == AuditKind.TOOL), reverse=True)
    truncated = len(records) > limit
    newest = records[:limit]
    newest.reverse()
    return SessionAudits(audits=newest, truncated=truncated)


# --------------------------------------------------------------------------------------------------
# Chat replay: the stored timeline events a follower turns into frames
# --------------------------------------------------------------------------------------------------
_RUN_OUTCOME_FIELDS = (
    "run_id",
    "session_id",
    "status",
    "release_decision",
    "content",
    "error_code",
    "error_message",
)


@dataclass(frozen=True, slots=True)
class ChatTimelineRow:
    """One stored timeline event that maps to a chat frame (RUN_STARTED, TOOL_INVOCATION, RUN_FINISHED)."""

    sequence_no: int
    event_type: str
    status: str
    details: dict


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
        .values_list("sequence_no", "event_type", "status", "details")
    ]
    run = DiagnosisRun.objects.only(*_RUN_OUTCOME_FIELDS).get(run_id=run_id)
    return rows, run


def finished_by(*, run_id: str, sequence_no: int) -> bool:
    """Whether the run's RUN_FINISHED is stored at or before `sequence_no` (one query)."""
    return TraceEvent.objects.filter(
        run_id=run_id, sequence_no__lte=sequence_no, event_type=EventType.RUN_FINISHED
    ).exists()
