"""What an attacker who can write the database and read this source forges, with the project's own
functions (issue 43 item 8): whole runs under new ids with every digest and link recomputed, events
appended to a finished run's chain, governance events. They cannot compute a write tag (the key is not in
the database): a forged link is stored untagged, or with a tag copied from a real link (which verifies
for that link's hash only)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from audit.models import (
    AgentStep,
    EventType,
    GovernanceEvent,
    Phase,
    TailPending,
    ToolInvocation,
    TraceEvent,
)
from audit.verify import row_digests
from audit.verify.hash_chain import GENESIS_HASH, link_hash
from audit.verify.row_digests import stored_reasoning_rows
from audit.write.governance import governance_hash
from diagnosis.models import ChatSession, DiagnosisRun
from reasoning.models import AgentReasoningAudit


def _copy(model, row, **changes) -> Any:
    values = {f.attname: getattr(row, f.attname) for f in model._meta.concrete_fields if not f.primary_key}
    values.update(changes)
    return model.objects.create(**values)


def rebind(run_id: str) -> None:
    """Put into each event of the run the digest of the row it binds as the row now is, then re-hash the
    chain (the latest binding of each row is what a verifier checks)."""
    run = DiagnosisRun.objects.get(run_id=run_id)
    steps = {(s.agent_name, s.step_index): s for s in AgentStep.objects.filter(run_id=run_id)}
    tools = {t.tool_call_id: t for t in ToolInvocation.objects.filter(run_id=run_id)}
    reasoning = {(r["step_index"], r["agent_name"]): r for r in stored_reasoning_rows(run_id=run_id)}
    prev = GENESIS_HASH
    for event in TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"):
        d = dict(event.details or {})
        if event.event_type == EventType.RUN_STARTED and "startDigest" in d:
            d["startDigest"] = row_digests.RUN_START.digest_of(run)
            d["sessionDigest"] = row_digests.SESSION.digest_of(run.session)
        if event.event_type == EventType.AGENT_MODEL_STEP and "stepDigest" in d:
            d["stepDigest"] = row_digests.STEP.digest_of(steps[(d.get("agentName"), d.get("stepIndex"))])
        if "rowDigest" in d and d.get("toolCallId") in tools:
            d["rowDigest"] = row_digests.tool_form(d.get("rowForm")).digest_of(tools[d["toolCallId"]])
        if "reasoningDigest" in d:
            key = (d.get("reasoningStepIndex", d.get("stepIndex")), d.get("agentName"))
            if key in reasoning:
                d["reasoningDigest"] = row_digests.REASONING.digest(reasoning[key], stored=True)
        if event.event_type == EventType.RUN_FINISHED and "runDigest" in d:
            d["runDigest"] = row_digests.run_form(d.get("runForm")).digest_of(run)
        event.details, event.prev_hash = d, prev
        event.hash = link_hash(event)
        TraceEvent.objects.filter(pk=event.pk).update(details=d, prev_hash=prev, hash=event.hash)
        prev = event.hash


def forge_run(source_run_id: str, *, question: str, answer: str, copy_tags: bool = False) -> str:
    """A complete run that never executed: the source run's session, run row, timeline, steps, tools and
    (copied) reasoning rows under new ids, with another question and answer, every digest and link
    recomputed. Its links carry no tag (or, `copy_tags`, the source's tags, made for other hashes)."""
    source = DiagnosisRun.objects.get(run_id=source_run_id)
    suffix = "f" * 8
    session = _copy(ChatSession, source.session, session_id=source.session_id[:-8] + suffix)
    run_id = source_run_id[:-8] + suffix
    run = _copy(
        DiagnosisRun, source, run_id=run_id, session_id=session.session_id, query=question, content=answer
    )
    ids = {"run_id": run.run_id, "session_id": session.session_id}
    for model in (AgentStep, ToolInvocation, AgentReasoningAudit):
        for row in model.objects.filter(run_id=source_run_id):
            _copy(model, row, **ids)
    for event in TraceEvent.objects.filter(run_id=source_run_id).order_by("sequence_no"):
        _copy(TraceEvent, event, **ids, tag=event.tag if copy_tags else "")
    rebind(run_id)
    return run_id


def forge_event(
    run_id: str,
    event_type: str,
    details: dict[str, Any],
    *,
    status: str = "",
    tag: str = "",
    note: bool = True,
) -> TraceEvent:
    """An event appended at the head of the run's chain, hashed like any (and, `note`, the tail note the
    service would write, so that the checkpointer looks at the run)."""
    head = TraceEvent.objects.filter(run_id=run_id).order_by("-sequence_no").first()
    event = TraceEvent(
        run_id=run_id,
        session_id=head.session_id,
        sequence_no=head.sequence_no + 1,
        phase=Phase.RUN,
        event_type=event_type,
        status=status,
        summary=f"{event_type.lower()} (forged)",
        details=details,
        prev_hash=head.hash,
        created_at=timezone.now(),
        tag=tag,
    )
    event.hash = link_hash(event)
    event.save(force_insert=True)
    if note:
        TailPending.objects.update_or_create(
            run_id=run_id, defaults={"last_sequence_no": event.sequence_no, "noted_at": timezone.now()}
        )
    return event


def forge_governance(
    event_type: str, *, actor: str = "", details: dict | None = None, **fields
) -> GovernanceEvent:
    """A governance event at the head of the chain, hashed like any, untagged."""
    head = GovernanceEvent.objects.order_by("-sequence_no").first()
    event = GovernanceEvent(
        sequence_no=head.sequence_no + 1,
        event_type=event_type,
        actor=actor,
        subject_user=fields.get("subject_user", ""),
        group=fields.get("group", ""),
        permission=fields.get("permission", ""),
        details=details or {},
        prev_hash=head.hash,
        created_at=fields.get("created_at") or timezone.now(),
    )
    event.hash = governance_hash(event)
    event.save(force_insert=True)
    return event
