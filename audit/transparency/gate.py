"""The checkpointer is a verifier first: only what authenticates is anchored (issue 43, item 2).

Before `audit.transparency.log` appends a leaf it verifies what the leaf would vouch for exactly as
`verify_audit` does: a run or a grown run tail (chain, write tags, rows against their digests, existing
anchors; a run with no chain is never anchored) and the governance chain's events after its newest
anchored head. What fails is refused with its problems (ids and sequence numbers, never content);
`report_refusals` logs it and records one `ANCHOR_REFUSED` governance event per run not reported before.
The rest of the batch is anchored all the same; a lost write is incompleteness, not a refusal.
Details: docs/audit-integrity.md, *How runs get into the log*.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Max

from audit.models import EventType, GovernanceEvent, GovernanceEventType, LogLeaf
from audit.read.chunks import events_of
from audit.transparency import leafdata
from audit.verify.authenticity import adoption, tag_verdict
from audit.verify.hash_chain import GENESIS_HASH
from audit.verify.runs import check_chunk, read_chunk
from audit.write.governance import governance_hash, record_governance_event
from core import writeauth
from diagnosis.models import DiagnosisRun

logger = logging.getLogger(__name__)

CHECKPOINTER = "checkpointer"
NO_CHAIN = "finished run without a chain: nothing authenticates it"


@dataclass(frozen=True, slots=True)
class Head:
    """What a run's leaf anchors, as the gate read and verified it."""

    run_id: str
    session_id: str
    sequence_no: int
    hash: str
    write_key_id: str
    finished_details: Any = None
    finished_at: dt.datetime | None = None


@dataclass(slots=True)
class Verdict:
    admitted: list[Head] = field(default_factory=list)
    refused: dict[str, list[str]] = field(default_factory=dict)


def admit_runs(run_ids: Iterable[str], *, pace: Callable[[], None] | None = None) -> Verdict:
    """Verify the runs `run_ids` (read now: the caller's transaction decides what is seen) and return
    the heads to anchor and the runs refused, in the order given. `pace`, when given, is called after
    each run's check (a serving process's checkpointer yields the interpreter there)."""
    ids = list(dict.fromkeys(run_ids))
    verdict = Verdict()
    if not ids:
        return verdict
    runs = {r.run_id: r for r in DiagnosisRun.objects.filter(run_id__in=ids)}
    events = events_of(ids)
    heads = {run_id: chain[-1] for run_id, chain in events.items()}
    finishes = {
        run_id: next((e for e in reversed(chain) if e.event_type == EventType.RUN_FINISHED), None)
        for run_id, chain in events.items()
    }
    ordered = [runs[i] for i in ids if i in runs]
    results = {}
    for result in check_chunk(read_chunk(ordered, events), book=None, adopted=adoption(), liveness=False):
        results[result.run_id] = result
        if pace is not None:
            pace()
    for run_id in ids:
        run, head, result = runs.get(run_id), heads.get(run_id), results.get(run_id)
        if run is None or result is None:
            continue  # purged or deleted since it was found: nothing to anchor
        if head is None:
            verdict.refused[run_id] = [NO_CHAIN]
            continue
        if result.invalid:
            verdict.refused[run_id] = list(result.invalid)
            continue
        key_id = writeauth.key_id_of_tag(head.tag)
        if not key_id:  # the newest link of a chain a leaf would vouch for is always tagged
            verdict.refused[run_id] = [f"sequence {head.sequence_no}: the chain's newest link carries no tag"]
            continue
        finish = finishes.get(run_id)
        verdict.admitted.append(
            Head(
                run_id=run_id,
                session_id=run.session_id,
                sequence_no=head.sequence_no,
                hash=head.hash,
                write_key_id=key_id,
                finished_details=finish.details if finish is not None else None,
                finished_at=finish.created_at if finish is not None else None,
            )
        )
    return verdict


# --------------------------------------------------------------------------------------------------
# The governance chain
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GovernanceHead:
    sequence_no: int
    hash: str
    created_at: dt.datetime
    write_key_id: str


def anchored_governance_head() -> tuple[int, str] | None:
    """(sequence_no, chainHead) of the newest anchored governance head, from the signed leaf data: the
    index column names the candidate, and when the leaf it names does not say the same (a column moved
    by a database writer) every governance leaf's data is read instead."""
    newest = LogLeaf.objects.aggregate(at=Max("governance_sequence_no"))["at"]
    if newest is not None:
        leaf = LogLeaf.objects.filter(governance_sequence_no=newest).only("data").first()
        fields = _governance_fields(leaf.data if leaf is not None else "")
        if fields is not None and fields["lastSequenceNo"] == newest:
            return newest, fields["chainHead"]
    found = None
    for data in LogLeaf.objects.filter(data__contains='"kind":"governance"').values_list("data", flat=True):
        fields = _governance_fields(data)
        if fields is not None and (found is None or fields["lastSequenceNo"] > found[0]):
            found = (fields["lastSequenceNo"], fields["chainHead"])
    return found


def _governance_fields(data: str) -> dict[str, Any] | None:
    try:
        return leafdata.decode_governance(data)
    except ValueError:
        return None


def admit_governance() -> tuple[GovernanceHead | None, list[str]]:
    """(the head to anchor, or None when the chain has not grown or does not verify; the problems) of
    the governance events after the newest anchored head: each links to the one before (the first to
    the anchored head), its hash is recomputed, and its tag verifies (untagged only where the upgrade
    adopted the chain, `audit.verify.authenticity`)."""
    anchored = anchored_governance_head()
    start, prev = anchored if anchored is not None else (0, GENESIS_HASH)
    events = list(GovernanceEvent.objects.filter(sequence_no__gt=start).order_by("sequence_no"))
    if not events:
        return None, []
    problems = []
    expected = start + 1
    for event in events:
        if event.sequence_no != expected:
            problems.append(f"governance sequence gap: {expected}–{event.sequence_no - 1} missing")
        if event.prev_hash != prev:
            problems.append(f"governance event {event.sequence_no}: prev_hash does not match")
        if governance_hash(event) != event.hash:
            problems.append(f"governance event {event.sequence_no}: stored hash does not match its content")
        prev, expected = event.hash, event.sequence_no + 1
    tags = tag_verdict(
        events,
        domain=writeauth.GOVERNANCE,
        vouched_upto=start,
        adopted_upto=adoption().governance_upto,
        what="governance event",
    )
    problems.extend(tags.problems)
    head = events[-1]
    key_id = writeauth.key_id_of_tag(head.tag)
    if problems or not key_id:
        return None, problems or [f"governance event {head.sequence_no}: the newest event carries no tag"]
    return GovernanceHead(head.sequence_no, head.hash, head.created_at, key_id), []


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------
def report_refusals(refused: dict[str, list[str]], governance: list[str] = ()) -> None:
    """Log every refusal (ids and counts only) and chain one `ANCHOR_REFUSED` event naming the runs not
    reported before (after the checkpoint committed: a refusal must never cost the anchored rest)."""
    for run_id, problems in refused.items():
        logger.warning("anchoring refused run=%s problems=%d", run_id, len(problems))
    if governance:
        logger.error("anchoring refused for the governance chain problems=%d", len(governance))
    if not refused:
        return
    new = sorted(set(refused) - reported_refusals())
    if not new:
        return
    try:
        record_governance_event(
            event_type=GovernanceEventType.ANCHOR_REFUSED,
            actor=CHECKPOINTER,
            details={"runIds": new, "problems": {run_id: len(refused[run_id]) for run_id in new}},
        )
    except Exception as exc:  # a governance chain that does not authenticate refuses every write
        logger.error("anchoring refusal not recorded runs=%d error=%s", len(new), type(exc).__name__)


def reported_refusals() -> set[str]:
    """The run ids every chained `ANCHOR_REFUSED` event names."""
    found: set[str] = set()
    rows = GovernanceEvent.objects.filter(event_type=GovernanceEventType.ANCHOR_REFUSED)
    for details in rows.values_list("details", flat=True):
        found.update(str(r) for r in (details or {}).get("runIds") or ())
    return found
