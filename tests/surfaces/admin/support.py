"""Runs for the admin console tests, recorded through the real recorder (like tests.factories)."""

from __future__ import annotations

import json
import time

from django.contrib.auth.models import Group
from django.utils import timezone

from audit.write import DeclaredToolCall, RetrievalFacts, RunRecorder, Usage
from core.groups import STAFF_VIEWERS
from diagnosis import services
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.capture import build_capture
from tests.factories import LEASE_OWNER, REASONING_MARKER, executing, usage

BLOCK_REASON = "evidence guard failed (UNKNOWN_CITATION); semantic guard found 1 unsupported claim"
UNSUPPORTED_CLAIM = "roll back image 1.42"


def grant_console(user):
    """Give a staff user the console's read access (the "Staff viewers" group made on migrate)."""
    user.groups.add(Group.objects.get(name=STAFF_VIEWERS))
    return user


def _call(ms: int):
    """A model call that takes about `ms` milliseconds: (started_at, finished_at, measured duration)."""
    started, t = timezone.now(), time.monotonic()
    time.sleep(ms / 1000)
    return started, timezone.now(), int((time.monotonic() - t) * 1000)


def record_blocked_run(
    run: DiagnosisRun, *, release_mode: str = "verified", draft_chars: int = 0
) -> RunRecorder:
    """A run whose answer cites an unknown evidence id and makes an unsupported claim: BLOCKED (under
    `release_mode`, with `draft_chars` of draft streamed to the reader).

    Model calls take a few real milliseconds; steps carry their recorded start and end times (as the
    runtime records them); the tool is measured by the recorder. The run is claimed first, as the
    executor claims it (`tests.factories.executing`).
    """
    rec = executing(run)
    rec.run_started(release_mode=release_mode, details={"leaseOwner": LEASE_OWNER})
    rec.mark_first_model_request()
    *_, routed_ms = _call(8)
    rec.routing_attempt(
        attempt=1, model="router-m", usage=usage(300, 20), ok=True, intent="DIAGNOSIS", confidence=0.9,
        duration_ms=routed_ms,
    )  # fmt: skip
    rec.routing_decision(intent="DIAGNOSIS", confidence=0.9, reason="deploy regression", fallback=False)
    call = DeclaredToolCall("call_kb", "lookup_knowledge", json.dumps({"query": "ingress 502"}))
    t0, t1, step_ms = _call(12)
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=usage(900, 40, reasoning=20, cached=256),
        reasoning=build_capture(
            reasoning=f"Check readiness. {REASONING_MARKER}", text="", tool_calls=[call.plan()]
        ),
        tool_calls=[call],
        finish_reason="tool_calls",
        started_at=t0,
        finished_at=t1,
        duration_ms=step_ms,
    )
    rec.tool_started(
        tool_call_id="call_kb", tool_name="lookup_knowledge", input_params={"query": "ingress 502"}
    )
    time.sleep(0.006)
    rec.tool_finished(
        tool_call_id="call_kb",
        status="SUCCEEDED",
        output=json.dumps({"items": [{"id": "kb:k8s-ingress-502#2", "text": "readiness " * 80}]}),
        retrieval=RetrievalFacts(layer="L0+L1", l0_match_count=1, l1_match_count=4, details={"l0": ["502"]}),
    )
    answer = f"The probe fails [kb:k8s-ingress-502#2]; {UNSUPPORTED_CLAIM} [kb:deploy-rollback#1]."
    t2, t3, answer_ms = _call(15)
    rec.model_step(
        step_index=2,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=usage(1500, 80, reasoning=30),
        reasoning=build_capture(reasoning=f"Answer now. {REASONING_MARKER}", text=answer),
        finish_reason="stop",
        started_at=t2,
        finished_at=t3,
        duration_ms=answer_ms,
    )
    rec.mark_first_output()
    rec.evidence_guard(
        retry=False,
        passed=False,
        reasons=["UNKNOWN_CITATION"],
        cited=["kb:k8s-ingress-502#2", "kb:deploy-rollback#1"],
        unknown=["kb:deploy-rollback#1"],
    )
    *_, guard_ms = _call(6)
    rec.semantic_guard(
        model="guard-m",
        usage=Usage.unavailable(),
        supported=False,
        unsupported_claims=[UNSUPPORTED_CLAIM],
        reason="not in the cited evidence",
        duration_ms=guard_ms,
    )
    rec.release(decision=ReleaseDecision.BLOCKED, reason=BLOCK_REASON)
    rec.note_draft(draft_chars)
    rec.finish(status=RunStatus.SUCCESS, content="The answer could not be verified and was withheld.")
    return rec


def make_blocked_run(
    owner, *, query: str = "Why does checkout-api return 502 since the deploy?", **delivery
) -> DiagnosisRun:
    session = services.create_session(owner=owner)
    run = services.create_run(session=session, query=query)
    record_blocked_run(run, **delivery)
    run.refresh_from_db()
    return run


def make_run_with_unfinished_tool(owner) -> DiagnosisRun:
    """A run whose executing process died with a tool RUNNING; a second recorder (the sweeper, which took
    the lease over: the next epoch) fails the run and closes the tool without a measured duration."""
    session = services.create_session(owner=owner)
    run = services.create_run(session=session, query="Disk IO is high, why?")
    rec = executing(run)
    rec.run_started(details={"leaseOwner": LEASE_OWNER})
    call = DeclaredToolCall("call_io", "lookup_knowledge", json.dumps({"query": "disk io"}))
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=usage(500, 20),
        reasoning=build_capture(reasoning=None, text="", tool_calls=[call.plan()]),
        tool_calls=[call],
        finish_reason="tool_calls",
        duration_ms=5,
    )
    rec.tool_started(tool_call_id="call_io", tool_name="lookup_knowledge", input_params={"query": "disk io"})
    epoch = services.claim_expired_run(run=DiagnosisRun.objects.get(pk=run.pk), owner="tests:sweeper")
    assert epoch is not None
    RunRecorder.resume(run.run_id, lease_epoch=epoch).finish(
        status=RunStatus.FAILED, error_code="LEASE_EXPIRED", error_message="the executing process stopped"
    )
    run.refresh_from_db()
    return run
