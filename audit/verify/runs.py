"""Verification of stored audit records, run by run, in bounded memory (`manage.py verify_audit`).

For each run: the timeline's hash chain and sequence numbers (`audit.verify.hash_chain.verify_chain`: 1..n
without gap or repeat, `prev_hash` links, each hash recomputed from its own fields); every durable row
(steps, tools, reasoning rows, reviews, the run's identity and its session's, the run's terminal
summary) against the digest its chain carries
(`audit.verify.rows.verify_rows`: a changed, deleted or unrecorded row is named); and, for a finished run,
whether the stored events, steps, tools and reasoning rows match the counts the chain says the recorder
attempted (older runs without counts in their chain: the run's `expected_*` columns) and whether any audit
write failed; and, for a run in the transparency log, that its stored chain still has the head its leaf
anchored (`audit.transparency.verify.check_anchor`; a finished run not yet anchored is a note). The log
itself (leaves, nodes, checkpoints, runs deleted whole) is checked by `audit.transparency.verify`; the
global governance chain of access changes by `verify_governance`, which also checks every anchor of that
chain's head in the transparency log.
Problems are worded without content (ids, sequence numbers, counts only). Reasoning rows are read as
stored (ciphertext), never decrypted. Every run's stored list facts (`persisted_*`, `audit_complete`) are
recomputed by the rule of `audit.read.list_facts` and any disagreement is a problem (`facts`), so that the
flag lists filter on can be trusted; `refresh_facts` rewrites them from the rule.

Runs are read in primary-key batches, each batch's events, steps, tools and reasoning rows in one query
each, so memory is bounded by the batch size whatever the number of runs.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from audit.models import (
    AgentStep,
    Checkpoint,
    EventType,
    LogLeaf,
    RunReview,
    RunTombstone,
    TailPending,
    ToolInvocation,
    TraceEvent,
)
from audit.read.chunks import run_chunks
from audit.read.list_facts import annotate_recomputed, disagreements, refresh_run_costs, refresh_run_facts
from audit.transparency import leafdata
from audit.transparency.verify import (
    UNANCHORED,
    StoredLeaf,
    check_anchor,
    leaf_problems,
    leaves_of,
    tails_of,
)
from audit.verify import appended_rows, provenance
from audit.verify.authenticity import (
    Adoption,
    adoption,
    anchored_before_write_authentication,
    legacy_vouched_upto,
    tag_verdict,
)
from audit.verify.hash_chain import timestamp, verify_chain
from audit.verify.holds import tombstone_problems
from audit.verify.provenance import CheckpointTimes, GovernanceView
from audit.verify.row_digests import stored_reasoning_rows
from audit.verify.rows import verify_rows
from core import writeauth
from diagnosis import services
from diagnosis.models import ChatSession, DiagnosisRun
from pricing.costs import cost_disagreements, load_price_book, price_of_run
from pricing.rules import CostStatus, PriceBook
from reasoning.models import AgentReasoningAudit

RUN_BATCH = 200


@dataclass(slots=True)
class RunVerification:
    run_id: str
    events: int = 0
    chain_valid: bool = True
    rows_verified: int = 0
    invalid: list[str] = field(default_factory=list)  # tampering, deletion, reordering
    incomplete: list[str] = field(default_factory=list)  # lost writes of a finished run
    facts: list[str] = field(default_factory=list)  # stored list facts that disagree with the rule
    unpriced: bool = False  # a terminal run whose cost was never priced (`pricing.costs`)
    notes: list[str] = field(default_factory=list)  # no failure: rows before row digests, purges
    leaf_index: int | None = None  # its leaf in the transparency log, None when not anchored
    unanchored: bool = False  # finished but not yet in the log (a note within the anchoring deadline)
    write_key_id: str = ""  # the write key whose tag authenticates the chain's newest link

    @property
    def ok(self) -> bool:
        return not self.invalid and not self.incomplete and not self.facts


def verify_run(run_id: str, *, governance: GovernanceView | None = None) -> RunVerification:
    """Verify one run (its events are checked even when the run row is missing; a run purged by
    retention is checked through its tombstone). `governance`: the governance chain as this
    verification read it (read here when not given)."""
    run = annotate_recomputed(DiagnosisRun.objects.filter(run_id=run_id)).first()
    events = list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))
    leaf = LogLeaf.objects.filter(run_id=run_id).first()
    tombstone = RunTombstone.objects.filter(run_id=run_id).first() if run is None and not events else None
    governance = governance or GovernanceView.load()
    if tombstone is not None:
        return _purged(run_id, tombstone, leaf, purge=governance.purges.get(run_id))
    steps, tools, reasoning, reviews = _rows([run_id])
    appended = appended_rows.rows_of([run_id])
    # One run alone: its leaves found by their signed data too, not only by the index columns.
    leaf, tails, leaf_index_problems = _leaves_by_data(run_id, leaf)
    noted = TailPending.objects.filter(run_id=run_id).exists()
    sessions = _sessions([run] if run is not None else [])
    result = _check(
        run_id,
        events,
        run=run,
        steps=steps[run_id],
        tools=tools[run_id],
        reasoning=reasoning[run_id],
        reviews=reviews[run_id],
        appended=appended.get(run_id, ()),
        leaf=leaf,
        tails=tails,
        tail_noted=noted,
        book=load_price_book(),
        session=sessions.get(run.session_id) if run is not None else None,
        adopted=governance.adopted,
        governance=governance,
        times=CheckpointTimes.load(),
    )
    result.invalid[:0] = leaf_index_problems
    if run is None:
        result.incomplete.append("no run row for these events")
    return result


def _leaves_by_data(run_id: str, leaf: LogLeaf | None) -> tuple[LogLeaf | None, list[LogLeaf], list[str]]:
    """The run's leaf, its tails and the problems of their index columns, the leaves searched by their
    signed data as well as by the index columns, so that a leaf whose `run_id` or `tail_of` column was
    cleared is still held against the run, and named (one scan of the leaves' data: for
    `verify_audit --run`, not for pages)."""
    needle = f'"runId":{json.dumps(run_id)}'
    found = {
        lf.pk: lf
        for lf in LogLeaf.objects.filter(Q(run_id=run_id) | Q(tail_of=run_id) | Q(data__contains=needle))
    }
    run_leaves, tails, problems = [], [], []
    for lf in sorted(found.values(), key=lambda lf: lf.leaf_index):
        fields, column_problems = leaf_problems(
            StoredLeaf(
                lf.leaf_index,
                lf.run_id,
                lf.tail_of,
                lf.session_id,
                lf.governance_sequence_no,
                lf.leaf_hash,
                lf.data,
            )
        )
        problems.extend(column_problems)
        if fields is None or fields.get("runId") != run_id:
            continue
        (run_leaves if fields["kind"] == leafdata.KIND_RUN else tails).append(lf)
    if run_leaves:
        # Held against what its data anchors, whatever its columns say (named above when they differ).
        first = run_leaves[0]
        first.run_id = run_id
        return first, tails + run_leaves[1:], problems
    return leaf, tails, problems


def _purged(
    run_id: str, tombstone: RunTombstone, leaf: LogLeaf | None, *, purge: tuple[int, dt.datetime] | None
) -> RunVerification:
    result = RunVerification(run_id=run_id, leaf_index=tombstone.leaf_index)
    result.notes.append(
        f"records purged {tombstone.purged_at.isoformat()} by {tombstone.purged_by} "
        f"({tombstone.reason}); its leaf {tombstone.leaf_index} stays in the transparency log"
    )
    if leaf is None:
        result.invalid.append("tombstone without a leaf in the transparency log")
        return result
    covering = Checkpoint.objects.filter(tree_size__gt=leaf.leaf_index).order_by("tree_size").first()
    try:
        fields = leafdata.decode(leaf.data)
    except ValueError:
        result.invalid.append(f"log leaf {leaf.leaf_index}: stored leaf data is not a run leaf")
        return result
    if fields["runId"] != run_id:
        result.invalid.append(f"log leaf {leaf.leaf_index}: its signed data anchors another run")
    result.invalid.extend(
        tombstone_problems(
            tombstone,
            leaf_index=leaf.leaf_index,
            finished_at=fields.get("finishedAt"),
            signed_at=covering.signed_at if covering else None,
            purge=purge,
            session_id=fields.get("sessionId"),
        )
    )
    return result


def verify_all_runs(
    *, batch_size: int = RUN_BATCH, governance: GovernanceView | None = None
) -> Iterator[RunVerification]:
    """Verify every run, oldest first, `batch_size` runs at a time, then every run id that audit rows
    name without a run row (`orphaned_run_ids`). `governance`: the governance chain as this
    verification read it (read here when not given)."""
    book = load_price_book()
    governance, times = governance or GovernanceView.load(), CheckpointTimes.load()
    adopted = governance.adopted
    for runs, by_run in run_chunks(annotate_recomputed(DiagnosisRun.objects.all()), batch_size):
        yield from check_runs(runs, by_run, book=book, adopted=adopted, governance=governance, times=times)
    for run_id in orphaned_run_ids():
        yield verify_run(run_id, governance=governance)


def check_runs(
    runs: list[DiagnosisRun],
    events: dict[str, list[TraceEvent]],
    *,
    book: PriceBook | None,
    adopted: Adoption,
    now: dt.datetime | None = None,
    liveness: bool = True,
    governance: GovernanceView | None = None,
    times: CheckpointTimes | None = None,
) -> Iterator[RunVerification]:
    """Verify `runs` (one batch) given their events in sequence order (`events`, run id → events;
    consumed): their rows, leaves, tails, tail notes and sessions are read with one query each. What
    `verify_audit` checks of every run, and what the checkpointer checks before it anchors one
    (`audit.transparency.gate`: without a price `book`, the cost is not compared; without `liveness`,
    a run late for anchoring is not a problem of its own)."""
    ids = [r.run_id for r in runs]
    steps, tools, reasoning, reviews = _rows(ids)
    appended = appended_rows.rows_of(ids)
    leaves = leaves_of(ids)
    tails = tails_of(ids)
    noted = set(TailPending.objects.filter(run_id__in=ids).values_list("run_id", flat=True))
    sessions = _sessions(runs)
    for run in runs:
        yield _check(
            run.run_id,
            events.pop(run.run_id, []),
            run=run,
            steps=steps.pop(run.run_id, []),
            tools=tools.pop(run.run_id, []),
            reasoning=reasoning.pop(run.run_id, []),
            reviews=reviews.pop(run.run_id, []),
            appended=appended.get(run.run_id, ()),
            leaf=leaves.get(run.run_id),
            tails=tails.get(run.run_id, ()),
            tail_noted=run.run_id in noted,
            book=book,
            session=sessions.get(run.session_id),
            adopted=adopted,
            now=now,
            liveness=liveness,
            governance=governance,
            times=times,
        )


def orphaned_run_ids() -> list[str]:
    """The run ids that stored audit rows (events, steps, tools, reasoning rows, reviews) name but no
    run row has (a run row deleted, or rows forged for a run that never was), and those of tombstones
    without a run leaf (a tombstone forged for a run never anchored). Each is verified like a run
    (`verify_run`), so that its rows are named."""
    known = DiagnosisRun.objects.values("run_id")
    anchored = LogLeaf.objects.filter(run_id__isnull=False).values("run_id")
    named = [
        model.objects.exclude(run_id__in=known).order_by().values_list("run_id", flat=True)
        for model in (TraceEvent, AgentStep, ToolInvocation, AgentReasoningAudit, RunReview)
    ]
    tombstones = RunTombstone.objects.exclude(run_id__in=anchored).order_by().values_list("run_id", flat=True)
    ids = set(named[0].union(*named[1:], tombstones))  # one query (UNION: distinct)
    ids.update(appended_rows.orphan_run_ids())
    return sorted(ids)


def _rows(run_ids: list[str]) -> tuple[dict[str, list], dict[str, list], dict[str, list], dict[str, list]]:
    steps: dict[str, list[AgentStep]] = defaultdict(list)
    reviews: dict[str, list[RunReview]] = defaultdict(list)
    for review in RunReview.objects.filter(run_id__in=run_ids).order_by("run_id", "sequence_no"):
        reviews[review.run_id].append(review)
    tools: dict[str, list[ToolInvocation]] = defaultdict(list)
    reasoning: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for step in AgentStep.objects.filter(run_id__in=run_ids).order_by("run_id", "step_index", "id"):
        steps[step.run_id].append(step)
    for tool in ToolInvocation.objects.filter(run_id__in=run_ids).order_by("run_id", "id"):
        tools[tool.run_id].append(tool)
    for row in stored_reasoning_rows(run_id__in=run_ids):
        reasoning[row["run_id"]].append(row)
    return steps, tools, reasoning, reviews


def _sessions(runs: list[DiagnosisRun]) -> dict[str, ChatSession]:
    """The stored sessions of `runs` by session id (one query), for the identity their runs bind."""
    ids = {r.session_id for r in runs}
    return {s.session_id: s for s in ChatSession.objects.filter(session_id__in=ids)} if ids else {}


def _check(
    run_id: str,
    events: list[TraceEvent],
    *,
    run: DiagnosisRun | None,
    steps: list[AgentStep],
    tools: list[ToolInvocation],
    reasoning: list[dict[str, Any]],
    reviews: list[RunReview] = (),
    appended: Any = (),
    leaf: LogLeaf | None = None,
    tails: list[LogLeaf] = (),
    tail_noted: bool | None = None,
    book: PriceBook | None = None,
    session: ChatSession | None = None,
    adopted: Adoption | None = None,
    now: dt.datetime | None = None,
    liveness: bool = True,
    governance: GovernanceView | None = None,
    times: CheckpointTimes | None = None,
) -> RunVerification:
    verdict = verify_chain(events)
    result = RunVerification(run_id=run_id, events=verdict.events, chain_valid=verdict.valid)
    result.invalid.extend(verdict.problems)
    anchors = [lf for lf in (leaf, *tails) if lf is not None]
    tags = tag_verdict(
        events,
        domain=writeauth.RUN,
        vouched_upto=legacy_vouched_upto(anchors),
        adopted_upto=lambda: (adopted or adoption()).runs.get(run_id, 0),
    )
    result.invalid.extend(tags.problems)
    if tags.legacy:
        result.notes.append(
            f"{tags.legacy} event(s) recorded before write authentication: the signed log vouches for them"
        )
    result.write_key_id = tags.head_key_id
    if (
        run is not None
        and not services.created_by_the_service(run)
        and not anchored_before_write_authentication(anchors)
    ):
        result.invalid.append(
            "run row not created by the service: its creation tag does not verify over its identity "
            "(id, session, question, flow, purpose, creation time)"
        )
    anchor_problems, anchor_notes = check_anchor(
        run=run, events=events, leaf=leaf, tails=tails, tail_noted=tail_noted
    )
    result.invalid.extend(anchor_problems)
    result.leaf_index = leaf.leaf_index if leaf is not None else None
    result.unanchored = UNANCHORED in anchor_notes
    result.notes.extend(n for n in anchor_notes if n != UNANCHORED)
    if liveness:
        result.invalid.extend(liveness_problems(run, events, anchored=leaf is not None, now=now))
    result.invalid.extend(
        provenance.run_problems(
            run_id=run_id,
            session_id=run.session_id if run is not None else "",
            events=events,
            anchors=anchors,
            view=governance,
            times=times,
        )
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
    result.rows_verified = rows.verified
    result.invalid.extend(rows.problems)
    result.notes.extend(rows.notes)
    if run is not None and hasattr(run, "recomputed_audit_complete"):
        result.facts.extend(disagreements(run))
        result.facts.extend(review_fact_problems(run, events, reviews))
    if run is not None and book is not None and run.is_terminal:
        # The stored cost (`pricing.costs`), recomputed from the chained usage records.
        usage = [e.details or {} for e in events if e.event_type == EventType.MODEL_TOKEN_USAGE]
        recomputed, _calls = price_of_run(run, usage, book=book)
        result.facts.extend(cost_disagreements(run, recomputed))
        result.unpriced = run.cost_status == CostStatus.NOT_PRICED
    if run is not None and run.is_terminal:
        if rows.unfinished:
            result.incomplete.append(rows.unfinished)
        expected = rows.expected
        checks = [
            ("timeline event", len(events), expected.events if expected else run.expected_events),
            ("model step", len(steps), expected.steps if expected else run.expected_steps),
            ("tool invocation", len(tools), expected.tools if expected else run.expected_tools),
        ]
        if expected is not None and expected.reasoning is not None:
            checks.append(("reasoning row", len(reasoning), expected.reasoning))
        for label, stored, wanted in checks:
            if stored < wanted:
                result.incomplete.append(f"{wanted - stored} {label}(s) expected but not stored")
            elif stored > wanted:
                result.incomplete.append(f"{stored - wanted} {label}(s) stored beyond the {wanted} expected")
        if run.audit_write_failures:
            result.incomplete.append(f"{run.audit_write_failures} audit write failure(s) recorded")
    return result


def liveness_problems(
    run: Any | None, events: list[Any], *, anchored: bool, now: dt.datetime | None
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


def chained_review_facts(events: list[Any], reviews: list[Any]) -> dict[str, Any]:
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


def review_fact_problems(run: DiagnosisRun, events: list[Any], reviews: list[Any]) -> list[str]:
    """The run's stored review facts (what the review queue and the lists read) against the chain: a
    queue emptied by setting `reviewed_at`, a verdict flipped on the row, a down-vote hidden."""
    chained = chained_review_facts(events, reviews)
    return [
        f"stored {name} is {getattr(run, name)!r}, the chain says {value!r}"
        for name, value in chained.items()
        if getattr(run, name) != value
    ]


def refresh_facts(results: list[RunVerification]) -> int:
    """Rewrite the stored list facts of the runs among `results` whose facts disagreed (the review facts
    from the chain's reviews and votes too); returns how many run rows were rewritten."""
    stale = [r.run_id for r in results if r.facts or r.unpriced]
    refresh_run_costs(run_ids=stale)
    for run_id in stale:
        events = list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))
        reviews = list(RunReview.objects.filter(run_id=run_id))
        DiagnosisRun.objects.filter(run_id=run_id).update(**chained_review_facts(events, reviews))
    return refresh_run_facts(run_ids=stale)
