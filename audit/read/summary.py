"""The trace summary: what a run's stored record proves, decided from rows already loaded (no query).

`summarize` compares what is stored with what the recorder expected to write, and every stored row with
the digest its chain carries, so an incomplete or altered audit is visible, never silent (seed 001,
sections 6–8); `reconcile_trace` is its token reconciliation at read time. It never queries and never
reads reasoning text. The trace (`audit.read.trace`) calls it; `audit.read.list_facts` is the rule in SQL.
Details: docs/api.md, *The trace summary*.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from audit.models import AgentStep, LogLeaf, RunReview, ToolInvocation, TraceEvent
from audit.verify.reconcile import Reconciliation
from audit.verify.rows import UNCHECKED
from audit.verify.run_check import anchor_times, check_run, reconcile_loaded
from diagnosis.models import DiagnosisRun


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


def _n(count: int, label: str) -> str:
    return f"{count} {label}{'' if count == 1 else 's'}"


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
    session: Any = UNCHECKED,
    tail_noted: bool | None = None,
) -> TraceSummary:
    """The run's one verification (`audit.verify.run_check.check_run`) in the trace's shape: compare
    stored, expected and returned records of `run`, every stored row (its session's too) with its digest
    in the chain, and the chain with every head anchored for it in the transparency log; see the module
    docstring. `reasoning`: the run's reasoning rows as stored
    (`audit.verify.row_digests.stored_reasoning_rows`); `leaf` and `tails`: the run's leaf and run-tail
    leaves as `anchored_leaves` reads them (None, (): not anchored), whose covering checkpoints' times
    the run's times are held to; `session`: the run's stored session row (not given: not checked);
    `tail_noted`: whether a tail note waits for the run (None: not known)."""
    check = check_run(
        run.run_id,
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
        times=anchor_times([lf for lf in (leaf, *tails) if lf is not None]),
    )
    by_kind = {c.kind: c for c in check.counts}
    expected = Counts(by_kind["events"].expected, by_kind["steps"].expected, by_kind["tools"].expected)
    gaps: list[str] = []
    complete = True

    def gap(*problems: str) -> None:
        nonlocal complete
        if problems:
            complete = False
            gaps.extend(problems)

    if not check.terminal:
        gap(f"run still {run.status}")
    lost = {c.kind: c for c in check.lost()}
    for kind in ("events", "steps", "tools", "reasoning"):
        c = lost.get(kind)
        if c is not None and c.stored < c.expected:
            gap(f"{_n(c.expected - c.stored, c.label)} expected but not stored")
        elif c is not None:
            # A finished run's counts are final; more rows than attempted means the counts were not saved.
            gap(f"{_n(c.stored - c.expected, c.label)} stored beyond the {c.expected} expected")
        if kind in _RETURNED and getattr(returned, kind) < getattr(persisted, kind):
            shown, stored = getattr(returned, kind), getattr(persisted, kind)
            gap(f"{_n(stored - shown, by_kind[kind].label)} stored under this run but another session")
    if check.write_failures:
        gap(f"{_n(check.write_failures, 'audit write failure')} recorded")
    gap(*(f"hash chain: {problem}" for problem in check.chain.problems))
    gap(*(f"write authentication: {problem}" for problem in check.tags.problems))
    if check.tags.legacy:
        gaps.append(
            f"{_n(check.tags.legacy, 'event')} recorded before write authentication (the log vouches)"
        )
    if not check.created_by_the_service:
        gap("write authentication: the run row was not created by the service (creation tag)")
    gap(*check.rows.problems)
    if check.rows.unfinished:
        gap(check.rows.unfinished)
    gaps.extend(check.rows.notes)
    gap(*(f"tool call {t} still RUNNING after the run ended" for t in check.running_tools))
    gap(*(f"transparency log: {problem}" for problem in check.anchor_problems))
    gap(*(f"provenance: {problem}" for problem in check.provenance))
    gap(*check.released)
    if check.release_after_failure:
        gap(f"run {run.status} carries {check.release_after_failure}")

    # Refused tool lifecycle steps: recorded faithfully (the first facts stand), named, not incomplete.
    gaps.extend(check.conflicts)
    # Provider-side facts: named, but they do not make the audit itself incomplete.
    ledger = check.ledger
    gaps.extend(ledger.notes())
    if check.ledger_unreconciled():
        gaps.append("token ledger not reconciled when the run finished")
    # Refused, not lost: a previous lease owner's writes after the takeover, none of them stored.
    if check.fenced_writes:
        gaps.append(
            f"{_n(check.fenced_writes, 'write')} of a previous lease owner refused by the lease fence"
        )

    return TraceSummary(
        persisted=persisted,
        expected=expected,
        returned=returned,
        audit_complete=complete,
        audit_write_failures=run.audit_write_failures,
        chain_valid=check.chain.valid,
        gaps=gaps,
        fenced_writes=run.fenced_writes,
        ledger=ledger,
        rows_verified=check.rows.all_verified,
        rows_verified_count=check.rows.verified,
        anchor=_anchor_view(leaf),
    )


_RETURNED = ("events", "steps", "tools")


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
    """The run's token reconciliation from rows already loaded (no query): the one of the run's
    verification (`audit.verify.run_check.reconcile_loaded`)."""
    return reconcile_loaded(run=run, events=events, steps=steps)
