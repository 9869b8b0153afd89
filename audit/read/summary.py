"""The trace summary: what a run's stored record proves, decided from rows already loaded (no query).

`summarize` compares what is stored with what the recorder expected to write, and every stored row with
the digest its chain carries, so that an incomplete or altered audit is visible and never silent (seed
001, sections 6–8); `reconcile_trace` is its token reconciliation. The trace (`audit.read.trace`)
calls it on the rows it read; the list facts recompute the same rule in SQL (`audit.read.list_facts`).

Summary semantics (documented in docs/api.md):

* `persisted`: rows stored under the run's id; `expected`: what the recorder attempted, as its chain
  records it (`RUN_FINISHED`'s counts plus governance events; before the finish, the events
  themselves; the run's `expected_*` columns for runs recorded before row digests or whose finish is
  not in the chain); `returned`: rows in this response — the persisted rows whose `session_id` is the
  run's session (a row stored under the run's id but another session is excluded and named in `gaps`).
* `chainValid`: `audit.verify.hash_chain.verify_chain` over every persisted event (1..n without gap or repeat,
  each `prev_hash` the previous `hash`, each hash recomputed from its own fields). Every event must also
  carry a write tag that verifies (`audit.verify.authenticity.tag_verdict`, the rule `verify_audit` applies):
  an event the service did not write is named in `gaps` and the audit is incomplete; events recorded
  before write authentication that the signed log vouches for are a note.
* `rowsVerified` is true when every stored row of the run (steps, tools, reasoning rows, the run's
  terminal summary) carries a digest in the chain and matches it when recomputed from its stored columns
  (`audit.verify.rows.verify_rows`), no bound row is missing, and a finished run's chain holds its
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
* `ledger` is the token reconciliation at read time (`audit.verify.reconcile`) over the rows already loaded:
  the stored usage events and step rows against the run's ledger columns and its `model_calls` (counted as
  calls start). It names each call whose records differ or that lacks usage; the run's `reconciled` is
  this verdict and the one the recorder wrote at finish.
* A FAILED or CANCELLED run never carries a release decision or content (the recorder withdraws one
  recorded before the failure); a stored row that does is named in `gaps` and the audit is incomplete.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from audit.models import (
    TOOL_CONFLICT,
    AgentStep,
    EventType,
    LogLeaf,
    RunReview,
    ToolInvocation,
    ToolStatus,
    TraceEvent,
)
from audit.transparency.verify import check_anchor
from audit.verify.authenticity import (
    adoption,
    anchored_before_write_authentication,
    legacy_vouched_upto,
    tag_verdict,
)
from audit.verify.hash_chain import verify_chain
from audit.verify.reconcile import CallUsage, KeptLedger, Reconciliation, reconcile, usage_counts
from audit.verify.rows import verify_rows
from core import writeauth
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunStatus


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
    appended: Sequence[Any] = (),
) -> TraceSummary:
    """Compare stored, expected and returned records of `run`, and every stored row with its digest in
    the chain, and the chain with every head anchored for it in the transparency log; see the module
    docstring. `reasoning`: the run's reasoning rows as stored
    (`audit.verify.row_digests.stored_reasoning_rows`); `leaf` and `tails`: the run's leaf and run-tail leaves
    as `anchored_leaves` reads them (None, (): not anchored)."""
    rows = verify_rows(
        events=events,
        run=run,
        steps=steps,
        tools=tools,
        reasoning=reasoning,
        reviews=reviews,
        appended=appended,
    )
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
    anchors = [lf for lf in (leaf, *tails) if lf is not None]
    tags = tag_verdict(
        events,
        domain=writeauth.RUN,
        vouched_upto=legacy_vouched_upto(anchors),
        adopted_upto=lambda: adoption().runs.get(run.run_id, 0),
    )
    if tags.problems:
        complete = False
        gaps.extend(f"write authentication: {problem}" for problem in tags.problems)
    if tags.legacy:
        gaps.append(f"{_n(tags.legacy, 'event')} recorded before write authentication (the log vouches)")
    if not services.created_by_the_service(run) and not anchored_before_write_authentication(anchors):
        complete = False
        gaps.append("write authentication: the run row was not created by the service (creation tag)")
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
