"""Verification of stored audit records, run by run, in bounded memory (`manage.py verify_audit`).

For each run: the hash chain, every durable row against the digest its chain carries, the counts the
chain says the recorder attempted, audit write failures, the anchored head, and the stored list facts
against their rule (`refresh_facts` rewrites them). Runs are read in primary-key batches, so memory is
bounded whatever the number of runs. Problems name ids, sequence numbers and counts, never content;
reasoning rows are read as stored, never decrypted. The log and the governance chain are checked
elsewhere (`audit.transparency.verify`, `verify_governance`).
Details: docs/audit-integrity.md, *What `verify_audit` checks per run (`audit/verify/runs.py`)*.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from audit.models import (
    AgentStep,
    Checkpoint,
    LogLeaf,
    RunReview,
    RunTombstone,
    TailPending,
    ToolInvocation,
    TraceEvent,
)
from audit.read.chunks import run_chunks
from audit.read.list_facts import annotate_recomputed, refresh_run_costs, refresh_run_facts
from audit.transparency import leafdata
from audit.transparency.store import tails_of
from audit.transparency.verify import StoredLeaf, leaf_problems, leaves_of
from audit.verify import appended_rows
from audit.verify.authenticity import Adoption
from audit.verify.chunk_reads import RowsOfRuns, RowsOfSessions
from audit.verify.holds import tombstone_problems
from audit.verify.provenance import CheckpointTimes, GovernanceView
from audit.verify.row_digests import stored_reasoning_rows
from audit.verify.run_check import (  # the review facts and liveness re-exported: their home was here
    RunCheck,
    chained_review_facts,
    check_run,
    liveness_problems,
    review_fact_problems,
)
from diagnosis.models import ChatSession, DiagnosisRun
from pricing.costs import load_price_book
from pricing.rules import PriceBook
from reasoning.models import AgentReasoningAudit

__all__ = [
    "RUN_BATCH",
    "ChunkRows",
    "RunVerification",
    "chained_review_facts",
    "check_chunk",
    "liveness_problems",
    "orphaned_run_ids",
    "read_chunk",
    "refresh_facts",
    "review_fact_problems",
    "verification_of",
    "verify_all_runs",
    "verify_run",
]

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
        rows = read_chunk(runs, by_run)
        yield from check_chunk(rows, book=book, adopted=adopted, governance=governance, times=times)
    for run_id in orphaned_run_ids():
        yield verify_run(run_id, governance=governance)


@dataclass(slots=True)
class ChunkRows:
    """Every stored row that one batch of runs is verified against (`read_chunk`), read apart from the
    check (`check_chunk`) so that a verifier can read the next batch while it checks this one."""

    runs: list[DiagnosisRun]
    events: dict[str, list[TraceEvent]]
    steps: dict[str, list]
    tools: dict[str, list]
    reasoning: dict[str, list]
    reviews: dict[str, list]
    appended: Any
    leaves: dict[str, LogLeaf]
    tails: dict[str, list[LogLeaf]]
    noted: set[str]
    sessions: dict[str, ChatSession]


def read_chunk(runs: list[DiagnosisRun], events: dict[str, list[TraceEvent]]) -> ChunkRows:
    """The rows `runs` (one batch, with their events in sequence order) are checked against: their
    steps, tools, reasoning rows, reviews, appended rows, leaves, tails, tail notes and sessions, one
    query each."""
    ids = [r.run_id for r in runs]
    steps, tools, reasoning, reviews = _rows(ids)
    return ChunkRows(
        runs=runs,
        events=events,
        steps=steps,
        tools=tools,
        reasoning=reasoning,
        reviews=reviews,
        appended=appended_rows.rows_of(ids),
        leaves=leaves_of(ids),
        tails=tails_of(ids),
        noted=set(TailPending.objects.filter(run_id__in=ids).values_list("run_id", flat=True)),
        sessions=_sessions(runs),
    )


def check_chunk(
    rows: ChunkRows,
    *,
    book: PriceBook | None,
    adopted: Adoption,
    now: dt.datetime | None = None,
    liveness: bool = True,
    governance: GovernanceView | None = None,
    times: CheckpointTimes | None = None,
) -> Iterator[RunVerification]:
    """Verify the runs of one batch from their rows (`read_chunk`; consumed), with no query. What
    `verify_audit` checks of every run, and what the checkpointer checks before it anchors one
    (`audit.transparency.gate`: without a price `book`, the cost is not compared; without `liveness`,
    a run late for anchoring is not a problem of its own)."""
    for run in rows.runs:
        yield _check(
            run.run_id,
            rows.events.pop(run.run_id, []),
            run=run,
            steps=rows.steps.pop(run.run_id, []),
            tools=rows.tools.pop(run.run_id, []),
            reasoning=rows.reasoning.pop(run.run_id, []),
            reviews=rows.reviews.pop(run.run_id, []),
            appended=rows.appended.get(run.run_id, ()),
            leaf=rows.leaves.get(run.run_id),
            tails=rows.tails.get(run.run_id, ()),
            tail_noted=run.run_id in rows.noted,
            book=book,
            session=rows.sessions.get(run.session_id),
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


_STEPS = RowsOfRuns(AgentStep, ("run_id", "step_index", "id"))
_TOOLS = RowsOfRuns(ToolInvocation, ("run_id", "id"))
_REVIEWS = RowsOfRuns(RunReview, ("run_id", "sequence_no"))
_SESSIONS = RowsOfSessions()


def _rows(run_ids: list[str]) -> tuple[dict[str, list], dict[str, list], dict[str, list], dict[str, list]]:
    """The steps, tools, reasoning rows (as stored) and reviews of `run_ids`, by run id: every column
    under its attribute name, without model instances (as the trace read reads them: the digests cover
    every column; building a model per row was most of a chunk's read)."""
    reasoning: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in stored_reasoning_rows(run_id__in=run_ids):
        reasoning[row["run_id"]].append(row)
    return _STEPS(run_ids), _TOOLS(run_ids), reasoning, _REVIEWS(run_ids)


def _sessions(runs: list[DiagnosisRun]) -> dict[str, ChatSession]:
    """The stored sessions of `runs` by session id (one query), for the identity their runs bind."""
    return _SESSIONS(sorted({r.session_id for r in runs}))


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
    """The run's one verification (`audit.verify.run_check.check_run`) in `verify_audit`'s shape."""
    check = check_run(
        run_id,
        events,
        run=run,
        steps=steps,
        tools=tools,
        reasoning=reasoning,
        reviews=reviews,
        appended=appended,
        session=session,
        leaf=leaf,
        tails=tails,
        tail_noted=tail_noted,
        adopted=adopted,
        governance=governance,
        times=times,
        book=book,
        liveness=liveness,
        now=now,
    )
    return verification_of(check, run)


def verification_of(check: RunCheck, run: DiagnosisRun | None) -> RunVerification:
    """`check` in `verify_audit`'s shape: what was tampered with is invalid, what a finished run lost
    is incomplete, stored facts that disagree with the rule are facts, the rest notes."""
    result = RunVerification(
        run_id=check.run_id,
        events=check.chain.events,
        chain_valid=check.chain.valid,
        rows_verified=check.rows.verified,
        leaf_index=check.leaf_index,
        unanchored=check.unanchored,
        write_key_id=check.tags.head_key_id,
        facts=check.facts,
        unpriced=check.unpriced,
    )
    result.invalid.extend(check.chain.problems)
    result.invalid.extend(check.tags.problems)
    if check.tags.legacy:
        result.notes.append(
            f"{check.tags.legacy} event(s) recorded before write authentication: "
            "the signed log vouches for them"
        )
    if not check.created_by_the_service:
        result.invalid.append(
            "run row not created by the service: its creation tag does not verify over its identity "
            "(id, session, question, flow, purpose, creation time)"
        )
    result.invalid.extend(check.anchor_problems)
    result.notes.extend(check.anchor_notes)
    result.invalid.extend(check.liveness)
    result.invalid.extend(check.provenance)
    result.invalid.extend(check.released)
    result.invalid.extend(check.rows.problems)
    result.notes.extend(check.rows.notes)
    result.notes.extend(check.conflicts)
    if check.fenced_writes:
        result.notes.append(
            f"{check.fenced_writes} write(s) of a previous lease owner refused by the lease fence"
        )
    if check.terminal:
        if check.rows.unfinished:
            result.incomplete.append(check.rows.unfinished)
        for c in check.lost():
            if c.stored < c.expected:
                result.incomplete.append(f"{c.expected - c.stored} {c.label}(s) expected but not stored")
            else:
                result.incomplete.append(
                    f"{c.stored - c.expected} {c.label}(s) stored beyond the {c.expected} expected"
                )
        if check.write_failures:
            result.incomplete.append(f"{check.write_failures} audit write failure(s) recorded")
        result.incomplete.extend(
            f"tool call {t} still RUNNING after the run ended" for t in check.running_tools
        )
    if check.release_after_failure:
        result.incomplete.append(f"run {run.status} carries {check.release_after_failure}")
    return result


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
