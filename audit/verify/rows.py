"""Verification of a run's durable rows against the digests its chain carries (`audit.verify.row_digests`).

`verify_rows` recomputes every digest from the stored rows and names each row that does not match, is
missing, or is stored without a record in the chain, in words and ids only (never content). Rows of runs
recorded before row digests are reported as not bound, a note, not a failure. The chain is read by
`audit.verify.chain_digests.collect`, which the offline bundle verifier shares.
Details: docs/architecture.md, *What a record proves, and what it does not*.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from audit.events import label as event_label
from audit.payloads import canonical_json, sha256_hex
from audit.verify import row_digests
from audit.verify.chain_digests import (
    GOVERNANCE_EVENTS,
    Bound,
    collect,
    reasoning_label,
    step_key,
    step_label,
    unclaimed,
)

NOT_BOUND = "not bound (recorded before row digests)"
IDENTITY_NOT_BOUND = "run identity (question, session, owner) not bound (started before identity digests)"
# `verify_rows(session=…)` not given: the session row is not checked (a caller without it at hand).
UNCHECKED = object()
__all__ = ["GOVERNANCE_EVENTS", "NOT_BOUND", "Expected", "RowVerdict", "verify_rows"]


@dataclass(frozen=True, slots=True)
class Expected:
    """What the recorder attempted to write, as read from the chain."""

    events: int
    steps: int
    tools: int
    reasoning: int | None  # None: not known (a run recorded before row digests)


@dataclass(slots=True)
class RowVerdict:
    """`verified`: rows whose stored form matches the digest bound in the chain; `problems`: rows that do
    not (changed, missing, unrecorded); `notes`: facts that are no failure (rows recorded before row
    digests, purged reasoning); `unfinished`: set for a terminal run whose chain holds no `RUN_FINISHED`
    (its write failed or the chain's tail was cut off: a loss, shown with the counts). `expected` is read
    from the chain; None when the chain carries no counts (a finished run recorded before row digests,
    or one whose finish is not in the chain: the caller falls back to the run's columns)."""

    verified: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    expected: Expected | None = None
    unfinished: str | None = None

    @property
    def all_verified(self) -> bool:
        """Every row is bound and matches: no problem, no unbound (pre-digest) row, no missing finish."""
        return not self.problems and self.unfinished is None and not any(NOT_BOUND in n for n in self.notes)


def verify_rows(
    *,
    events: Sequence[Any],
    run: Any | None,
    steps: Iterable[Any],
    tools: Iterable[Any],
    reasoning: Iterable[Mapping[str, Any]],
    reviews: Iterable[Any] = (),
    session: Any = UNCHECKED,
    appended: Iterable[Any] = (),
) -> RowVerdict:
    """Verify one run's stored rows against the digests in its (ordered) events; `session`: the run's
    stored session row (None: there is none), checked against RUN_STARTED's `sessionDigest` unless
    not given."""
    bindings = collect(events)
    rows = _RowCheck(digests_seen=bindings.digests_seen)
    _check_run_rows(rows, bindings, steps, tools, reasoning)
    _check_appended_rows(rows, bindings, reviews, appended)
    for what, bound in unclaimed(bindings.steps, bindings.tools, bindings.reasoning):
        rows.verdict.problems.append(f"{what} missing (recorded at sequence {bound.sequence_no})")
    _check_terminal(rows, bindings, run)
    _check_identity(rows.verdict, bindings, run, session)
    verdict = rows.done()
    verdict.expected = _expected(bindings, run, events)
    return verdict


class _RowCheck:
    """One run's rows checked against the digests its chain binds: the verdict, and the rows recorded
    before row digests (`legacy`, by label: noted, never a failure) once the chain holds no digest."""

    def __init__(self, *, digests_seen: bool) -> None:
        self.verdict = RowVerdict()
        self.digests_seen = digests_seen
        self.legacy: dict[str, list[str]] = {}

    def unrecorded(self, label: str, name: str, what: str) -> None:
        if self.digests_seen:
            self.verdict.problems.append(f"{what}: stored row not recorded in the chain")
        else:
            self.legacy.setdefault(label, []).append(name)

    def check(self, label: str, name: str, what: str, bound: Bound | None, digest: str) -> None:
        if bound is None:
            self.unrecorded(label, name, what)
        elif bound.digest is None:
            self.legacy.setdefault(label, []).append(name)
        elif bound.digest == digest:
            self.verdict.verified += 1
            if bound.purged:
                self.verdict.notes.append(f"{what} purged (sequence {bound.sequence_no})")
        else:
            self.verdict.problems.append(
                f"{what}: stored row does not match its digest at sequence {bound.sequence_no}"
            )

    def done(self) -> RowVerdict:
        """The verdict, with a note per label of the rows recorded before row digests."""
        for label, names in self.legacy.items():
            self.verdict.notes.append(
                f"{label}{'' if len(names) == 1 else 's'} {', '.join(names)}: {NOT_BOUND}"
            )
        return self.verdict


def _check_run_rows(
    rows: _RowCheck,
    bindings: Any,
    steps: Iterable[Any],
    tools: Iterable[Any],
    reasoning: Iterable[Mapping[str, Any]],
) -> None:
    """The rows the run's recorder wrote: model steps, tool calls (in the form their event names) and
    reasoning rows; each bound one is taken from `bindings` (what is left is missing)."""
    for step in steps:
        key = step_key(step.step_index, step.agent_name)
        label = step_label(key)
        rows.check(
            "model step",
            label.removeprefix("model step "),
            label,
            bindings.steps.pop(key, None),
            row_digests.STEP.digest_of(step),
        )
    for tool in tools:
        bound = bindings.tools.pop(tool.tool_call_id, None)
        form = row_digests.tool_form(bound.form if bound is not None else None)
        if form is None:
            rows.verdict.problems.append(
                f"tool call {tool.tool_call_id}: bound at sequence {bound.sequence_no} in an unknown form"
            )
            continue
        rows.check(
            "tool call", tool.tool_call_id, f"tool call {tool.tool_call_id}", bound, form.digest_of(tool)
        )
    for row in reasoning:
        key = (row["step_index"], row["agent_name"])
        rows.check(
            "reasoning row",
            reasoning_label(key),
            f"reasoning row for {reasoning_label(key)}",
            bindings.reasoning.pop(key, None),
            row_digests.REASONING.digest(row, stored=True),
        )


def _check_appended_rows(
    rows: _RowCheck, bindings: Any, reviews: Iterable[Any], appended: Iterable[Any]
) -> None:
    """Rows others appended after the run: reviews, and rows of a higher layer bound by appended events
    (`audit.verify.appended_rows.AppendedRow`). They exist only since row digests, so one outside the
    chain is never "legacy"; one bound but not stored is missing."""
    problems = rows.verdict.problems
    for review in reviews:
        what = f"review {review.review_id}"
        bound = bindings.reviews.pop(review.review_id, None)
        if bound is None:
            problems.append(f"{what}: stored row not recorded in the chain")
        else:
            rows.check("review", review.review_id, what, bound, row_digests.REVIEW.digest_of(review))
    for review_id, bound in bindings.reviews.items():
        problems.append(f"review {review_id} missing (recorded at sequence {bound.sequence_no})")
    bound_appended = bindings.appended
    for row in appended:
        what = f"{row.label} {row.row_id}"
        bound = bound_appended.pop((row.event_type, row.row_id), None)
        if bound is None:
            problems.append(f"{what}: stored row not recorded in the chain")
        else:
            rows.check(row.label, row.row_id, what, bound, row.digest)
    for (event_type, row_id), bound in bound_appended.items():
        if bound.digest is not None:
            what = event_label(event_type).lower()
            problems.append(f"{what} {row_id} missing (recorded at sequence {bound.sequence_no})")


def _check_terminal(rows: _RowCheck, bindings: Any, run: Any | None) -> None:
    """The run's terminal summary against RUN_FINISHED's digest (in the form it names); a terminal run
    whose chain holds no RUN_FINISHED is `unfinished`."""
    finished, verdict = bindings.finished, rows.verdict
    if run is not None and finished is not None:
        seq, digest, _, form_name = finished
        form = row_digests.run_form(form_name)
        if digest is None:
            rows.legacy.setdefault("run summary", []).append(run.run_id)
        elif form is None:
            verdict.problems.append(f"run: terminal summary at sequence {seq} names an unknown form")
        elif digest == form.digest_of(run):
            verdict.verified += 1
        else:
            verdict.problems.append(
                "run: stored terminal summary (status, release, error, content, token ledger, expected "
                f"counts) does not match its digest at sequence {seq}"
            )
    elif run is not None and run.is_terminal and bindings.digests_seen:
        verdict.unfinished = "run: terminal summary not recorded in the chain"


def _expected(bindings: Any, run: Any | None, events: Sequence[Any]) -> Expected | None:
    """The counts the chain carries: RUN_FINISHED's (plus what governance appended), or, for a run still
    executing, what its events so far announce; None when the chain carries none."""
    finished = bindings.finished
    if finished is not None and isinstance(finished[2], dict):
        counts = finished[2]
        return Expected(
            events=int(counts.get("events", 0)) + bindings.governance,
            steps=int(counts.get("steps", 0)),
            tools=int(counts.get("tools", 0)),
            reasoning=(
                None
                if counts.get("reasoning") is None
                else int(counts["reasoning"]) + bindings.appended_reasoning
            ),
        )
    if finished is None and not (run is not None and run.is_terminal):
        return Expected(
            events=events[-1].sequence_no if events else 0,
            steps=bindings.step_events,
            tools=bindings.tool_starts,
            reasoning=bindings.reasoning_events if bindings.digests_seen else None,
        )
    return None


def _check_identity(verdict: RowVerdict, bindings: Any, run: Any | None, session: Any) -> None:
    """The run's and its session's identity against RUN_STARTED's digests (`run-start`, `session`).
    Only problems and notes: the run row is counted once, by its terminal summary, and the session is
    not a row of the run (the counts of `verified` stay what the trace and `verify_audit` both show)."""
    started = bindings.started
    if run is None or started is None:
        return  # no run row (named by the caller) or no RUN_STARTED (a chain problem if one was written)
    _check_configuration(verdict, bindings, run, started.sequence_no)
    if started.digest is None:
        verdict.notes.append(IDENTITY_NOT_BOUND)
        return
    form = row_digests.start_form(started.form)
    if form is None:
        verdict.problems.append(f"run: identity at sequence {started.sequence_no} names an unknown form")
    elif form.digest_of(run) != started.digest:
        verdict.problems.append(
            "run: stored identity (question, session, agent flow, creation time) does not match its "
            f"digest at sequence {started.sequence_no}"
        )
    bound = bindings.session
    if session is UNCHECKED or bound is None or bound.digest is None:
        return
    form = row_digests.session_form(bound.form)
    where = f"session {run.session_id}"
    if form is None:
        verdict.problems.append(f"{where}: bound at sequence {bound.sequence_no} in an unknown form")
    elif session is None:
        verdict.problems.append(f"{where} missing (bound at sequence {bound.sequence_no})")
    elif form.digest_of(session) != bound.digest:
        verdict.problems.append(
            f"{where}: stored owner or creation time does not match its digest at sequence "
            f"{bound.sequence_no}"
        )


def _check_configuration(verdict: RowVerdict, bindings: Any, run: Any, sequence_no: int) -> None:
    """The run's `config_fingerprint` column against RUN_STARTED's chained `configFingerprint` (a run
    started before fingerprints carries neither), its `purpose` against the chained `purpose` (none:
    `production`, a run started before purposes), and that fingerprint against the SHA-256 of the
    chained `configuration` document's canonical JSON."""
    stored = getattr(run, "config_fingerprint", None)
    if stored is not None and stored != bindings.config_fingerprint:
        verdict.problems.append(
            f"run: stored configuration fingerprint does not match RUN_STARTED at sequence {sequence_no}"
        )
    purpose = getattr(run, "purpose", None)
    if purpose is not None and purpose != (bindings.purpose or "production"):
        verdict.problems.append(f"run: stored purpose does not match RUN_STARTED at sequence {sequence_no}")
    document = bindings.configuration
    if (
        bindings.config_fingerprint
        and isinstance(document, dict)
        and not document.get("truncated")
        and sha256_hex(canonical_json(document)) != bindings.config_fingerprint
    ):
        verdict.problems.append(
            f"run: configuration chained at sequence {sequence_no} does not hash to its fingerprint"
        )
