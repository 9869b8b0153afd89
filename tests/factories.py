"""Build realistic runs through the real recorder (no hand-made audit rows), for tests of every layer.

A run built here looks like one the runtime executed (`agent.runtime.executor.execute_run`): its
lease is claimed through the real claim (`diagnosis.services.claim_run`: the next `lease_epoch`, so 1 or
more, and this module's lease owner), RUN_STARTED names that owner as the executor's does, every write is
fenced by the claimed epoch, and `finish` releases the lease (no owner, no expiry, the epoch kept)."""

from __future__ import annotations

import json

from audit.write import DeclaredToolCall, RetrievalFacts, RunRecorder, Usage
from diagnosis import services
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.capture import build_capture

REASONING_MARKER = "REASONING-MARKER-7f3a"
# The lease owner of runs these factories execute (the executor's is `host:pid:uuid`).
LEASE_OWNER = "tests:factories"


def usage(prompt: int, completion: int, reasoning: int | None = None, cached: int | None = None) -> Usage:
    return Usage(
        available=True,
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        reasoning_tokens=reasoning,
        cached_tokens=cached,
    )


def claim(run: DiagnosisRun, *, owner: str = LEASE_OWNER) -> DiagnosisRun:
    """`run` (PENDING, lease free) claimed as the executor claims it, with the next epoch; the claimed
    run. Fails the test when the run cannot be claimed."""
    claimed = services.claim_run(run_id=run.run_id, owner=owner)
    assert claimed is not None, f"run {run.run_id} is not claimable"
    return claimed


def executing(run: DiagnosisRun, *, group_commit: bool | None = None) -> RunRecorder:
    """The recorder of `run` as its executor holds it: the run claimed (`claim`), fenced by that epoch."""
    return RunRecorder.for_run(claim(run), group_commit=group_commit)


def record_full_run(
    run: DiagnosisRun,
    *,
    tools: int = 2,
    extra_steps: int = 0,
    recorder: RunRecorder | None = None,
    reasoning_text: str = f"The lag pattern suggests a long transaction. {REASONING_MARKER}",
    provider: str = "",
    answer: str = "Replication lags because of a long transaction [kb:mysql-replication-lag#1].",
) -> RunRecorder:
    """A complete, published diagnosis run: route, one step with `tools` parallel calls, `extra_steps`
    more tool-free steps, the answer step, both guards, release and finish. Without `recorder` the run
    is claimed first (`executing`: epoch 1 or more, RUN_STARTED names the lease owner); a given
    recorder is used as it is."""
    rec = recorder or executing(run)
    details = {"leaseOwner": LEASE_OWNER} if recorder is None else {}
    if provider:
        details["provider"] = provider
    rec.run_started(release_mode="verified", details=details or None)
    rec.mark_first_model_request()
    rec.routing_attempt(
        attempt=1, model="router-m", usage=usage(120, 20), ok=True, intent="DIAGNOSIS", confidence=0.92
    )
    rec.routing_decision(intent="DIAGNOSIS", confidence=0.92, reason="replication symptom", fallback=False)
    calls = [
        DeclaredToolCall(
            tool_call_id=f"call_{i}",
            name="lookup_knowledge",
            arguments=json.dumps({"query": f"replication lag {i}"}),
        )
        for i in range(tools)
    ]
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=usage(800, 60, reasoning=40, cached=128),
        reasoning=build_capture(reasoning=reasoning_text, text="", tool_calls=[c.plan() for c in calls]),
        tool_calls=calls,
        finish_reason="tool_calls",
        duration_ms=900,
    )
    for call in calls:
        rec.tool_started(
            tool_call_id=call.tool_call_id, tool_name=call.name, input_params=json.loads(call.arguments)
        )
        rec.tool_finished(
            tool_call_id=call.tool_call_id,
            status="SUCCEEDED",
            output=json.dumps({"items": [{"id": "kb:mysql-replication-lag#1", "text": "x" * 900}]}),
            retrieval=RetrievalFacts(
                layer="L0+L1", l0_match_count=1, l1_match_count=3, details={"l0": ["t"]}
            ),
        )
    for extra in range(extra_steps):
        rec.model_step(
            step_index=2 + extra,
            agent_name="diagnosis_agent",
            model="agent-m",
            usage=usage(900, 30),
            reasoning=build_capture(reasoning=None, text="thinking aloud"),
            finish_reason="stop",
        )
    rec.model_step(
        step_index=2 + extra_steps,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=usage(1500, 90, reasoning=30),
        reasoning=build_capture(reasoning=reasoning_text, text=answer),
        finish_reason="stop",
        duration_ms=1200,
    )
    rec.mark_first_output()
    rec.evidence_guard(retry=False, passed=True, cited=["kb:mysql-replication-lag#1"])
    rec.semantic_guard(model="guard-m", usage=usage(600, 25), supported=True, reason="all claims cited")
    rec.release(decision=ReleaseDecision.PUBLISHED, reason="guards passed")
    rec.finish(status=RunStatus.SUCCESS, content=answer)
    return rec


def make_recorded_run(owner, *, query: str = "Why is replication lagging?", **kwargs) -> DiagnosisRun:
    session = services.create_session(owner=owner)
    run = services.create_run(session=session, query=query)
    record_full_run(run, **kwargs)
    run.refresh_from_db()
    return run


def issue_token(user, *, otp_verified: bool = False, ttl_hours: float | None = None) -> str:
    """An API token for `user` through the real service (stored hashed); returns its plaintext."""
    from access.services import issue_token as issue

    return issue(user=user, actor="tests", otp_verified=otp_verified, ttl_hours=ttl_hours).plaintext


def totp_device(user):
    """A confirmed TOTP device for `user` (django-otp), as an administrator registers one."""
    from django_otp.plugins.otp_totp.models import TOTPDevice

    return TOTPDevice.objects.create(user=user, name="authenticator", confirmed=True)


def totp_code(device, *, at: float | None = None) -> str:
    """The device's current TOTP code, computed as an authenticator app does (RFC 6238)."""
    import time

    from django_otp.oath import TOTP

    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    totp.time = time.time() if at is None else at
    return f"{totp.token():0{device.digits}d}"


def make_waiting_approval(owner) -> tuple[DiagnosisRun, str]:
    """An AI Ops run interrupted with one `create_silence` call waiting for approval, recorded through
    the recorder as the runtime records it (no model, no Alertmanager); returns the run and the call id."""
    from agent.runtime import approvals
    from diagnosis.models import AgentFlow

    session = services.create_session(owner=owner)
    run = services.create_run(session=session, query="Alert Drill: silence it", agent_flow=AgentFlow.AI_OPS)
    rec = executing(run)
    rec.run_started(release_mode="verified", details={"leaseOwner": LEASE_OWNER})
    arguments = {
        "matchers": [{"name": "alertname", "value": "Drill", "isRegex": False, "isEqual": True}],
        "duration_minutes": 30,
        "comment": "drill",
    }
    call = DeclaredToolCall(
        tool_call_id="call_silence", name="create_silence", arguments=json.dumps(arguments)
    )
    rec.model_step(
        step_index=1,
        agent_name="executor",
        model="agent-m",
        usage=usage(100, 10),
        reasoning=build_capture(reasoning="", text="", tool_calls=[call.plan()]),
        tool_calls=[call],
        finish_reason="tool_calls",
    )
    rec.tool_awaiting_approval(
        tool_call_id=call.tool_call_id,
        tool_name=call.name,
        input_params=arguments,
        approvers={"permission": "diagnosis.approve_tool_call", "group": "Approvers", "requester": ""},
        deadline=approvals.expiry_of,  # the runtime's own rule
    )
    rec.interrupt(pending=[call.tool_call_id], checkpoint_sha256="0" * 64, reason="tests")
    run.refresh_from_db()
    return run, call.tool_call_id
