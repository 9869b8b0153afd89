"""Building a run's evidence bundle from the store (API `…/runs/{runId}/evidence`, `manage.py
export_evidence`); its format and verification are `audit.transparency.bundle`.

The bundle holds the run's whole chain, the canonical form of every step, tool row and the terminal
summary (what their digests are taken of: `audit.verify.row_digests.Form.document`), the digest of each
reasoning row (never its content, not even encrypted), the run's leaf, its inclusion proof in the newest
checkpoint (O(log n) stored nodes) and that checkpoint's body and signature, and each of its run-tail
leaves (what was appended after it was anchored) with its inclusion proof in the same checkpoint. A run
not yet anchored has `anchor: null` (the verifier then fails and says so). Queries: the run's events,
steps, tools and reasoning rows, its leaf and covering checkpoint, its tails, and the proofs' two each.
"""

from __future__ import annotations

from typing import Any

from audit.models import AgentStep, EventType, RunReview, ToolInvocation, TraceEvent
from audit.read.trace import written_with
from audit.transparency import bundle, note, signednote, store
from audit.transparency.verify import anchor_of, tails_of
from audit.verify import row_digests
from audit.verify.chain_digests import collect
from audit.verify.hash_chain import event_payload
from audit.verify.row_digests import stored_reasoning_rows
from core.db_router import reads_from_replica
from diagnosis.models import DiagnosisRun


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


@reads_from_replica(written_at=written_with)
def build_bundle(*, run: DiagnosisRun) -> dict[str, Any]:
    """The evidence bundle of `run` (the caller has decided the reader may see it)."""
    run_id = run.run_id
    events = list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))
    steps = AgentStep.objects.filter(run_id=run_id).order_by("id")
    tools = ToolInvocation.objects.filter(run_id=run_id).order_by("id")
    reasoning = stored_reasoning_rows(run_id=run_id)
    return {
        "format": bundle.FORMAT,
        "runId": run_id,
        "sessionId": run.session_id,
        "events": [_event(e) for e in events],
        "rows": {
            "steps": [_row(row_digests.STEP, row_digests.STEP.values_of(s)) for s in steps],
            "tools": [_row(form, form.values_of(t)) for t, form in _tool_forms(tools, events)],
            "reasoning": [
                {
                    "stepIndex": r["step_index"],
                    "agentName": r["agent_name"],
                    "digest": row_digests.REASONING.digest(r),
                }
                for r in reasoning
            ],
            "run": _run_row(run, events),
            "reviews": [
                _row(row_digests.REVIEW, row_digests.REVIEW.values_of(r))
                for r in RunReview.objects.filter(run_id=run_id).order_by("sequence_no")
            ],
            "identity": _identity(run, events),
        },
        **_anchors(run_id),
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


def _anchors(run_id: str) -> dict[str, Any]:
    """`anchor` (the run leaf in the newest checkpoint) and `tails` (its run-tail leaves, proven in the
    same checkpoint)."""
    anchor = anchor_of(run_id)
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
    """The checkpoint as a bundle carries it: a C2SP signed note with the log's signature and every
    stored witness cosignature (`{"note"}`), or, for a checkpoint signed before issue 35, its JSON body
    and signature (`{"body", "signature"}`)."""
    if note.is_legacy(cp.body):
        return {"body": cp.body, "signature": cp.signature}
    cosignatures = [
        f"{signednote.DASH} {c.witness} {c.signature}" for c in cp.cosignatures.order_by("witness", "key_id")
    ]
    origin = note.parse_note_body(cp.body).origin
    return {"note": note.signed_note(cp.body, origin, cp.signature, cosignatures)}
