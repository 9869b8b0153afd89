"""Building a run's evidence bundle from the store (API `…/runs/{runId}/evidence`, `manage.py
export_evidence`); its format and verification are `audit.transparency.bundle`.

The bundle holds the run's whole chain, the canonical forms its digests are taken of, each reasoning
row's digest only (never its content, not even encrypted), the run's leaf and tails with their inclusion
proofs in the newest checkpoint, and that checkpoint; a run not yet anchored has `anchor: null`. It reads
a fixed number of queries per run. `build_evidence` adds the server's verdict on the same rows (the run's
one verification, `audit.verify.run_check.check_run`); the bundle is the same either way.
Details: docs/audit-integrity.md, *The evidence bundle*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.models import AgentStep, EventType, RunReview, TailPending, ToolInvocation, TraceEvent
from audit.read.trace import written_with
from audit.transparency import bundle, note, signednote, store
from audit.transparency.store import tails_of
from audit.transparency.verify import anchor_of
from audit.verify import appended_rows, row_digests
from audit.verify.chain_digests import collect
from audit.verify.hash_chain import event_payload
from audit.verify.provenance import CheckpointTimes
from audit.verify.row_digests import stored_reasoning_rows
from audit.verify.run_check import check_run
from audit.verify.runs import RunVerification, verification_of
from core.db_router import reads_from_replica
from diagnosis.models import ChatSession, DiagnosisRun


def _event(e: TraceEvent) -> dict[str, Any]:
    payload = event_payload(
        run_id=e.run_id,
        session_id=e.session_id,
        sequence_no=e.sequence_no,
        phase=e.phase,
        event_type=e.event_type,
        status=e.status,
        summary=e.summary,
        details=e.details,
        created_at=e.created_at,
    )
    return {**payload, "prevHash": e.prev_hash, "hash": e.hash}


def _row(form: row_digests.Form, values: dict[str, Any]) -> dict[str, Any]:
    return {"digest": form.digest(values), "form": form.document(values)}


@dataclass(frozen=True, slots=True)
class _Rows:
    """What a bundle is built from, read once: the same rows the run's verification checks."""

    events: list[TraceEvent]
    steps: list[AgentStep]
    tools: list[ToolInvocation]
    reasoning: list[dict[str, Any]]
    reviews: list[RunReview]


def _read(run: DiagnosisRun) -> _Rows:
    run_id = run.run_id
    return _Rows(
        events=list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no")),
        steps=list(AgentStep.objects.filter(run_id=run_id).order_by("id")),
        tools=list(ToolInvocation.objects.filter(run_id=run_id).order_by("id")),
        reasoning=stored_reasoning_rows(run_id=run_id),
        reviews=list(RunReview.objects.filter(run_id=run_id).order_by("sequence_no")),
    )


@reads_from_replica(written_at=written_with)
def build_bundle(*, run: DiagnosisRun) -> dict[str, Any]:
    """The evidence bundle of `run` (the caller has decided the reader may see it)."""
    return _bundle(run, _read(run), anchor_of(run.run_id))


@dataclass(frozen=True, slots=True)
class Evidence:
    """A run's bundle and what the server's own verification of the very rows it carries says
    (`audit.verify.run_check.check_run` in `verify_audit`'s shape; no governance replay, no liveness:
    those are `verify_audit`'s, over the whole store)."""

    bundle: dict[str, Any]
    verification: RunVerification


@reads_from_replica(written_at=written_with)
def build_evidence(*, run: DiagnosisRun) -> Evidence:
    """`build_bundle`, and the run's verification over the rows read for it (`manage.py
    export_evidence` reports it: a bundle of a record that does not verify is still exported — it is
    the evidence — but the exporter is told what the offline verifier will find)."""
    rows, anchor = _read(run), anchor_of(run.run_id)
    run_id = run.run_id
    leaf = anchor.leaf if anchor is not None else None
    check = check_run(
        run_id,
        rows.events,
        run=run,
        steps=rows.steps,
        tools=rows.tools,
        reasoning=rows.reasoning,
        reviews=rows.reviews,
        appended=appended_rows.rows_of([run_id]).get(run_id, ()),
        session=ChatSession.objects.filter(session_id=run.session_id).first(),
        leaf=leaf,
        tails=tails_of([run_id]).get(run_id, []),
        tail_noted=TailPending.objects.filter(run_id=run_id).exists() if leaf is not None else None,
        times=CheckpointTimes.load(),
    )
    return Evidence(bundle=_bundle(run, rows, anchor), verification=verification_of(check, run))


def _bundle(run: DiagnosisRun, rows: _Rows, anchor: Any) -> dict[str, Any]:
    run_id, events = run.run_id, rows.events
    return {
        "format": bundle.FORMAT,
        "runId": run_id,
        "sessionId": run.session_id,
        "events": [_event(e) for e in events],
        "rows": {
            "steps": [_row(row_digests.STEP, row_digests.STEP.values_of(s)) for s in rows.steps],
            "tools": [_row(form, form.values_of(t)) for t, form in _tool_forms(rows.tools, events)],
            "reasoning": [
                {
                    "stepIndex": r["step_index"],
                    "agentName": r["agent_name"],
                    "digest": row_digests.REASONING.digest(r),
                }
                for r in rows.reasoning
            ],
            "run": _run_row(run, events),
            "reviews": [_row(row_digests.REVIEW, row_digests.REVIEW.values_of(r)) for r in rows.reviews],
            "identity": _identity(run, events),
        },
        **_anchors(run_id, anchor),
    }


def _tool_forms(tools: Any, events: list[TraceEvent]) -> list[tuple[ToolInvocation, row_digests.Form]]:
    """Each tool row with the form its latest binding names (`rowForm`; none: the first form)."""
    bindings = collect(events).tools
    out = []
    for tool in tools:
        binding = bindings.get(tool.tool_call_id)
        form = row_digests.tool_form(binding.form if binding is not None else None) or row_digests.TOOL
        out.append((tool, form))
    return out


def _identity(run: DiagnosisRun, events: list[TraceEvent]) -> dict[str, Any]:
    """Who asked what, in the forms RUN_STARTED names (`run-start`, `session`); None where the chain
    binds none (a run started before identity digests)."""
    started = next((e for e in events if e.event_type == EventType.RUN_STARTED), None)
    details = (started.details or {}) if started is not None else {}
    start = row_digests.start_form(details.get("startForm")) if details.get("startDigest") else None
    session = row_digests.session_form(details.get("sessionForm")) if details.get("sessionDigest") else None
    return {
        "start": _row(start, start.values_of(run)) if start is not None else None,
        "session": _row(session, session.values_of(run.session)) if session is not None else None,
    }


def _run_row(run: DiagnosisRun, events: list[TraceEvent]) -> dict[str, Any] | None:
    """The terminal summary in the form its RUN_FINISHED names (`runForm`; none: the first form)."""
    if not run.is_terminal:
        return None
    finished = next((e for e in reversed(events) if e.event_type == EventType.RUN_FINISHED), None)
    name = (finished.details or {}).get("runForm") if finished is not None else None
    form = row_digests.run_form(name) or row_digests.RUN
    return _row(form, form.values_of(run))


def _anchors(run_id: str, anchor: Any) -> dict[str, Any]:
    """`anchor` (the run leaf in the newest checkpoint: `anchor_of`) and `tails` (its run-tail leaves,
    proven in the same checkpoint)."""
    if anchor is None or anchor.newest is None:
        return {"anchor": None, "tails": []}
    leaf, cp = anchor.leaf, anchor.newest
    proof = store.inclusion_proof(leaf.leaf_index, cp.tree_size)
    tails = [
        {
            "leafIndex": t.leaf_index,
            "leafData": t.data,
            "leafHash": t.leaf_hash,
            "inclusionProof": store.inclusion_proof(t.leaf_index, cp.tree_size).hex,
        }
        for t in tails_of([run_id]).get(run_id, [])
        if t.leaf_index < cp.tree_size
    ]
    return {
        "anchor": {
            "leafIndex": leaf.leaf_index,
            "leafData": leaf.data,
            "leafHash": leaf.leaf_hash,
            "treeSize": cp.tree_size,
            "inclusionProof": proof.hex,
            "checkpoint": checkpoint_document(cp),
        },
        "tails": tails,
    }


def checkpoint_document(cp) -> dict[str, Any]:
    """The checkpoint as a bundle (and the API) carries it: a C2SP signed note with the log's signature
    and every stored witness cosignature (`note`) and, for a plain checkpoint, its link as a signed note
    (`link`: its signing time and predecessor); or, for a checkpoint signed before issue 35, its JSON
    body and signature (`{"body", "signature"}`)."""
    if note.is_legacy(cp.body):
        return {"body": cp.body, "signature": cp.signature}
    cosignatures = [
        f"{signednote.DASH} {c.witness} {c.signature}" for c in cp.cosignatures.order_by("witness", "key_id")
    ]
    origin = note.parse_note_body(cp.body).origin
    document = {"note": note.signed_note(cp.body, origin, cp.signature, cosignatures)}
    if cp.link:
        document["link"] = note.signed_note(cp.link, origin, cp.link_signature)
    return document
