"""One run's verification, once: every check of a run's stored record, from rows already loaded.

`check_run` takes a run's rows as its caller read them (run, events, steps, tools, reasoning rows as
stored, reviews, appended rows, session, leaf and tails) and what the caller could afford besides
(adoption, governance view, checkpoint times, price book, clock), runs no query of its own, and returns
a `RunCheck` holding the verdict of every check, worded without content. The trace summary,
`verify_audit` and the checkpointer's gate map that one verdict into their shapes; only what their
callers can read differs, never the rule.
Details: docs/audit-integrity.md, *One verification per run (`audit/verify/run_check.py`)*.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings
from django.utils import timezone

from audit import failed_calls
from audit.models import TOOL_CONFLICT, EventType, ToolStatus
from audit.read.list_facts import disagreements
from audit.transparency.verify import UNANCHORED, check_anchor
from audit.verify import provenance
from audit.verify.authenticity import (
    Adoption,
    TagVerdict,
    adoption,
    anchored_before_write_authentication,
    legacy_vouched_upto,
    tag_verdict,
)
from audit.verify.hash_chain import ChainVerdict, timestamp, verify_chain
from audit.verify.provenance import CheckpointTimes, GovernanceView
from audit.verify.reconcile import CallUsage, KeptLedger, Reconciliation, reconcile, usage_counts
from audit.verify.rows import UNCHECKED, RowVerdict, verify_rows
from core import writeauth
from diagnosis import services
from diagnosis.models import RunStatus
from pricing.costs import cost_disagreements, price_of_run
from pricing.rules import CostStatus, PriceBook

COUNT_LABELS = {
    "events": "timeline event",
    "steps": "model step",
    "tools": "tool invocation",
    "reasoning": "reasoning row",
}


@dataclass(frozen=True, slots=True)
class CountCheck:
    """One kind of row: how many are stored under the run and how many the recorder attempted."""

    kind: str  # a key of COUNT_LABELS
    stored: int
    expected: int

    @property
    def label(self) -> str:
        return COUNT_LABELS[self.kind]


@dataclass(slots=True)
class RunCheck:
    """Every check of one run (see the module docstring). Lists hold problems worded without content;
    `problems` is what makes the record invalid (tampering, deletion, reordering), `losses` what makes
    a finished run's record incomplete (writes that were lost), `notes` neither."""

    run_id: str
    terminal: bool
    chain: ChainVerdict
    tags: TagVerdict
    created_by_the_service: bool
    rows: RowVerdict
    counts: list[CountCheck]
    anchor_problems: list[str] = field(default_factory=list)
    anchor_notes: list[str] = field(default_factory=list)
    unanchored: bool = False
    leaf_index: int | None = None
    liveness: list[str] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)
    running_tools: list[str] = field(default_factory=list)  # tool call ids still RUNNING after the end
    release_after_failure: str = ""  # "release PUBLISHED" / "released content" on a FAILED/CANCELLED run
    released: list[str] = field(default_factory=list)  # the failed-calls section against the chain
    write_failures: int = 0
    fenced_writes: int = 0
    conflicts: list[str] = field(default_factory=list)  # refused tool lifecycle steps (recorded, named)
    ledger: Reconciliation | None = None
    facts: list[str] = field(default_factory=list)  # stored list/review facts and cost against the rule
    unpriced: bool = False

    def lost(self) -> list[CountCheck]:
        """The counts that disagree: fewer rows stored than attempted; for a finished run (whose counts
        are final) also more; reasoning rows only once finished (their count is chained at the end)."""
        return [
            c
            for c in self.counts
            if (c.stored < c.expected and (self.terminal or c.kind != "reasoning"))
            or (c.stored > c.expected and self.terminal)
        ]

    def ledger_unreconciled(self) -> bool:
        """The recorder's verdict at finish was not reconciled though nothing read now disagrees."""
        ledger = self.ledger
        return (
            self.terminal
            and ledger is not None
            and not ledger.reconciled
            and not ledger.without_usage
            and not ledger.differences
        )


def check_run(
    run_id: str,
    events: Sequence[Any],
    *,
    run: Any | None,
    steps: Sequence[Any],
    tools: Sequence[Any],
    reasoning: Sequence[dict[str, Any]],
    reviews: Sequence[Any] = (),
    appended: Any = (),
    session: Any = UNCHECKED,
    leaf: Any | None = None,
    tails: Sequence[Any] = (),
    tail_noted: bool | None = None,
    adopted: Adoption | None = None,
    governance: GovernanceView | None = None,
    times: CheckpointTimes | None = None,
    book: PriceBook | None = None,
    liveness: bool = False,
    now: dt.datetime | None = None,
) -> RunCheck:
    """Verify one run from its loaded rows (see the module docstring). `run` None: events without a run
    row (the caller names that). `session`: the run's stored session row (None: there is none; not
    given: not checked). `tail_noted`: whether the run has a tail note (None: not known)."""
    terminal = run is not None and run.is_terminal
    anchors = [lf for lf in (leaf, *tails) if lf is not None]
    tags = tag_verdict(
        events,
        domain=writeauth.RUN,
        vouched_upto=legacy_vouched_upto(anchors),
        adopted_upto=lambda: (adopted or adoption()).runs.get(run_id, 0),
    )
    rows = verify_rows(
        events=events,
        run=run,
        steps=steps,
        tools=tools,
        reasoning=reasoning,
        reviews=reviews,
        session=session,
        appended=appended,
    )
    anchor_problems, anchor_notes = check_anchor(
        run=run, events=events, leaf=leaf, tails=tails, tail_noted=tail_noted
    )
    check = RunCheck(
        run_id=run_id,
        terminal=terminal,
        chain=verify_chain(events),
        tags=tags,
        created_by_the_service=(
            run is None
            or services.created_by_the_service(run)
            or anchored_before_write_authentication(anchors)
        ),
        rows=rows,
        counts=_counts(run, rows, events=events, steps=steps, tools=tools, reasoning=reasoning),
        anchor_problems=anchor_problems,
        anchor_notes=[n for n in anchor_notes if n != UNANCHORED],
        unanchored=UNANCHORED in anchor_notes,
        leaf_index=leaf.leaf_index if leaf is not None else None,
        provenance=provenance.run_problems(
            run_id=run_id,
            session_id=run.session_id if run is not None else "",
            events=events,
            anchors=anchors,
            view=governance,
            times=times,
        ),
    )
    if liveness:
        check.liveness = liveness_problems(run, events, anchored=leaf is not None, now=now)
    check.conflicts = [
        _conflict(e.details or {})
        for e in events
        if e.event_type == EventType.TOOL_INVOCATION and e.status == TOOL_CONFLICT
    ]
    if run is None:
        return check
    check.write_failures = run.audit_write_failures
    check.fenced_writes = run.fenced_writes
    if terminal:
        check.running_tools = [t.tool_call_id for t in tools if t.status == ToolStatus.RUNNING]
    if run.status in (RunStatus.FAILED, RunStatus.CANCELLED) and (run.release_decision or run.content):
        check.release_after_failure = (
            f"release {run.release_decision}" if run.release_decision else "released content"
        )
    check.released = released_problems(run, events)
    check.ledger = reconcile_loaded(run=run, events=events, steps=steps)
    if hasattr(run, "recomputed_audit_complete"):
        check.facts.extend(disagreements(run))
        check.facts.extend(review_fact_problems(run, events, reviews))
    if book is not None and terminal:
        # The stored cost (`pricing.costs`), recomputed from the chained usage records.
        usage = [e.details or {} for e in events if e.event_type == EventType.MODEL_TOKEN_USAGE]
        recomputed, _calls = price_of_run(run, usage, book=book)
        check.facts.extend(cost_disagreements(run, recomputed))
        check.unpriced = run.cost_status == CostStatus.NOT_PRICED
    return check


def released_problems(run: Any, events: Sequence[Any]) -> list[str]:
    """The released content's failed-calls section against the chain (`audit.failed_calls.problems`)."""
    release = next((e for e in reversed(events) if e.event_type == EventType.RELEASE_DECISION), None)
    if release is None:
        return []
    return failed_calls.problems(content=run.content, release_details=release.details or {}, events=events)


_CONFLICT_WORDS = {
    "CONFLICTING_START": "a start with other facts",
    "CONFLICTING_TERMINAL": "a terminal with other facts",
    "NOT_STARTED": "a terminal without a start",
}


def _conflict(details: dict) -> str:
    words = _CONFLICT_WORDS.get(str(details.get("reason")), "a conflicting lifecycle step")
    return f"tool call {details.get('toolCallId')}: {words} was refused"


def _counts(
    run: Any | None,
    rows: RowVerdict,
    *,
    events: Sequence[Any],
    steps: Sequence[Any],
    tools: Sequence[Any],
    reasoning: Sequence[Any],
) -> list[CountCheck]:
    """Stored against expected: the counts the chain records (RUN_FINISHED's, plus appended events;
    before the finish, the events themselves), else the run's `expected_*` columns (a run recorded
    before row digests, or whose finish is not in the chain). No run row: nothing to compare."""
    expected = rows.expected
    if expected is None and run is None:
        return []
    wanted = (
        (expected.events, expected.steps, expected.tools)
        if expected is not None
        else (run.expected_events, run.expected_steps, run.expected_tools)
    )
    counts = [
        CountCheck("events", len(events), wanted[0]),
        CountCheck("steps", len(steps), wanted[1]),
        CountCheck("tools", len(tools), wanted[2]),
    ]
    if expected is not None and expected.reasoning is not None:
        counts.append(CountCheck("reasoning", len(reasoning), expected.reasoning))
    return counts


def anchor_times(anchors: Sequence[Any]) -> CheckpointTimes:
    """The checkpoint times of the run's own anchors, from the first covering checkpoint annotated on
    each leaf (`covering_size`, `covering_signed_at`: `audit.read.trace.anchored_leaves`): for each
    anchor, the checkpoint `CheckpointTimes.covering` finds is the same as with every checkpoint read
    (any other covering size known is at least that one), so a reader of one run needs no query."""
    known = {
        int(lf.covering_size): lf.covering_signed_at
        for lf in anchors
        if getattr(lf, "covering_size", None) is not None and getattr(lf, "covering_signed_at", None)
    }
    times = CheckpointTimes()
    for size in sorted(known):
        i = bisect.bisect_left(times.sizes, size)
        times.sizes.insert(i, size)
        times.signed.insert(i, known[size])
    return times


def reconcile_loaded(*, run: Any, events: Sequence[Any], steps: Sequence[Any]) -> Reconciliation:
    """The run's token reconciliation from rows already loaded (no query). Before the run is terminal
    its ledger columns are not written yet, so only the stored records are compared with each other."""
    stored = [
        CallUsage.from_details(e.details or {}) for e in events if e.event_type == EventType.MODEL_TOKEN_USAGE
    ]
    step_usage = [
        (
            s.step_index,
            CallUsage(
                source="AGENT",
                step_index=s.step_index,
                available=bool(s.usage_available),
                **usage_counts(s),
                agent_name=s.agent_name,
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


def liveness_problems(
    run: Any | None, events: Sequence[Any], *, anchored: bool, now: dt.datetime | None
) -> list[str]:
    """A finished run the log does not anchor: a problem when it has no chain at all (nothing
    authenticates it, and the checkpointer never anchors a run without one), or when its finish
    (RUN_FINISHED's chained time; the run's column for a run whose finish was never chained) lies more
    than `AUDIT_ANCHOR_DEADLINE_SECONDS` back: every checkpoint since should have anchored it."""
    if anchored or run is None or not run.is_terminal:
        return []
    if not events:
        return ["finished run without a chain: nothing authenticates it, and the log never anchors it"]
    finished = next((e.created_at for e in reversed(events) if e.event_type == EventType.RUN_FINISHED), None)
    finished = finished or run.finished_at
    deadline = dt.timedelta(seconds=float(settings.AUDIT_ANCHOR_DEADLINE_SECONDS))
    if finished is None or finished + deadline >= (now or timezone.now()):
        return []
    return [
        f"finished {timestamp(finished)}, not anchored in the transparency log within "
        f"{deadline.total_seconds():g} s (AUDIT_ANCHOR_DEADLINE_SECONDS)"
    ]


def chained_review_facts(events: Sequence[Any], reviews: Sequence[Any]) -> dict[str, Any]:
    """The run's review facts as its chain records them: the newest review's verdict and time (its row
    is bound by REVIEW_RECORDED), and whether any reader's newest vote (FEEDBACK_RECORDED) is down."""
    latest = max(reviews, key=lambda r: r.sequence_no, default=None)
    votes: dict[str, str] = {}
    for event in events:
        if event.event_type == EventType.FEEDBACK_RECORDED and isinstance(event.details, dict):
            votes[str(event.details.get("reader"))] = str(event.details.get("rating"))
    return {
        "review_verdict": latest.verdict if latest is not None else "",
        "reviewed_at": latest.created_at if latest is not None else None,
        "downvoted": "down" in votes.values(),
    }


def review_fact_problems(run: Any, events: Sequence[Any], reviews: Sequence[Any]) -> list[str]:
    """The run's stored review facts (what the review queue and the lists read) against the chain: a
    queue emptied by setting `reviewed_at`, a verdict flipped on the row, a down-vote hidden."""
    chained = chained_review_facts(events, reviews)
    return [
        f"stored {name} is {getattr(run, name)!r}, the chain says {value!r}"
        for name, value in chained.items()
        if getattr(run, name) != value
    ]
