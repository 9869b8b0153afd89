"""The runtime end to end through the real `openai` SDK against the local fake provider: router, agent
loop, tool boundary, canonical store, guards, release, token ledger, timing and the durable audit."""

import asyncio
import hashlib
import json
import threading

import pytest

from agent.runtime import prompts
from agent.runtime.canonical import CanonicalStore
from agent.runtime.events import DraftEvent, ErrorEvent, OutcomeEvent, ProgressEvent, RunEvent, ToolEvent
from agent.runtime.executor import RunNotClaimable, prepare_run
from agent.runtime.pipeline import BLOCKED_MESSAGE, fixed_reply
from agent.runtime.tools.registry import ToolRegistry, default_registry
from audit.models import AgentStep, EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.read import get_trace
from audit.verify.hash_chain import verify_chain
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.models import AgentReasoningAudit
from tests.agent.runtime.support import (
    AGENT,
    GUARD,
    ROUTER,
    FailInserts,
    SqlLog,
    ask,
    evidence_ids,
    execute,
    in_every_runtime_thread,
)
from tests.fakes.openai_server import (
    HTTPError,
    Stream,
    finish_chunk,
    reasoning_chunks,
    stream_answer,
    stream_tool_calls,
    tool_call_chunks,
    usage,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]

THINKING = (
    "The user reports a full disk. Likely causes: unrotated logs or deleted files held open.\n\n"
    "I should search the runbooks for both the disk symptom and the log rotation angle."
)
TWO_LOOKUPS = [
    ("call_disk", "lookup_knowledge", json.dumps({"query": "disk full /var/log"})),
    ("call_rot", "lookup_knowledge", json.dumps({"query": "logrotate deleted files lsof", "top_k": 3})),
]


def _events(run_id):
    return list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))


def _types(run_id):
    return [e.event_type for e in _events(run_id)]


def parallel_lookups_with_reasoning():
    """Reasoning in many deltas, then two tool calls whose ids/arguments arrive in interleaved fragments."""
    return Stream(
        chunks=reasoning_chunks(THINKING, 14)
        + tool_call_chunks(TWO_LOOKUPS, fragments=4, interleave=True, role=False)
        + [finish_chunk("tool_calls")],
        usage=usage(400, 60, reasoning=30, cached=128),
    )


def cited_answer(request):
    ids = evidence_ids(request)
    text = (
        f"Logs under /var/log filled the disk [{ids[0]}]. "
        f"Deleted files still held open keep their space; find them with lsof [{ids[1]}]."
    )
    return stream_answer(
        text, reasoning="Both causes are in the evidence.", usage=usage(900, 80, reasoning=12), pieces=6
    )


def assert_complete_audit(run):
    trace = get_trace(run=run)
    s = trace.summary
    assert (s.persisted.events, s.persisted.steps, s.persisted.tools) == (
        s.expected.events,
        s.expected.steps,
        s.expected.tools,
    )
    assert s.audit_write_failures == 0 and s.chain_valid and s.audit_complete, s.gaps
    return trace


# --------------------------------------------------------------------------------------------------
# The happy path
# --------------------------------------------------------------------------------------------------
def test_cited_answer_with_two_parallel_tools_is_published_with_a_complete_trace(llm, corpus, user):
    llm.route("DIAGNOSIS", usage=usage(120, 20))
    llm.add(AGENT, parallel_lookups_with_reasoning(), cited_answer)
    llm.supported(usage=usage(300, 15))

    run, outcome, sink = ask(user, "The disk is full on /var/log, what now?")

    # Outcome, run row and live events agree.
    assert outcome.status == run.status == RunStatus.SUCCESS
    assert outcome.release_decision == run.release_decision == ReleaseDecision.PUBLISHED
    answer_request = llm.requests[AGENT][1]
    ids = evidence_ids(answer_request)
    assert outcome.content == run.content and f"[{ids[0]}]" in run.content and f"[{ids[1]}]" in run.content
    assert run.intent == "DIAGNOSIS" and run.error_code == "" and run.lease_owner == ""
    events = sink.events
    assert isinstance(events[0], RunEvent) and events[0].run_id == run.run_id
    assert isinstance(events[-1], OutcomeEvent) and events[-1].content == run.content
    # Verified release (the default): no answer text before the outcome; the reader saw progress.
    assert not sink.of_type(DraftEvent)
    assert run.release_mode == "verified" and run.draft_chars == 0
    assert run.first_output_at is not None and run.first_output_at <= run.finished_at
    assert run.release_latency_ms is not None and run.release_latency_ms >= 0
    stages = [(e.stage, e.status) for e in sink.of_type(ProgressEvent)]
    assert stages[:2] == [("ROUTING", "STARTED"), ("ROUTING", "FINISHED")]
    assert stages[-4:] == [
        ("EVIDENCE_GUARD", "FINISHED"),
        ("SEMANTIC_GUARD", "STARTED"),
        ("SEMANTIC_GUARD", "FINISHED"),
        ("RELEASE", "FINISHED"),
    ]
    tool_frames = [(e.tool_call_id, e.status) for e in sink.of_type(ToolEvent)]
    for call_id in ("call_disk", "call_rot"):
        assert tool_frames.index((call_id, "RUNNING")) < tool_frames.index((call_id, "SUCCEEDED"))
    # Frames that map to timeline events carry their sequence numbers.
    seq = {e.sequence_no: e for e in _events(run.run_id)}
    assert seq[events[0].sequence_no].event_type == EventType.RUN_STARTED
    assert seq[events[-1].sequence_no].event_type == EventType.RUN_FINISHED
    for frame in sink.of_type(ToolEvent):
        assert seq[frame.sequence_no].details["toolCallId"] == frame.tool_call_id

    # Timeline: every decision in order, chained, nothing missing.
    assert _types(run.run_id) == [
        "RUN_STARTED",
        "ROUTING_ATTEMPT",
        "MODEL_TOKEN_USAGE",
        "ROUTING_DECISION",
        "AGENT_MODEL_STEP",
        "MODEL_TOKEN_USAGE",
        *["TOOL_INVOCATION"] * 4,
        "AGENT_MODEL_STEP",
        "MODEL_TOKEN_USAGE",
        "EVIDENCE_GUARD_INITIAL",
        "SEMANTIC_GUARD_DECISION",
        "MODEL_TOKEN_USAGE",
        "RELEASE_DECISION",
        "RUN_FINISHED",
    ]
    trace = assert_complete_audit(run)
    assert verify_chain(_events(run.run_id)).valid

    # Steps: the fragments were assembled; reasoning captured; usage per step.
    step1, step2 = trace.steps
    assert step1.has_tool_call and step1.finish_reason == "tool_calls" and step1.model == AGENT
    assert AgentStep.objects.get(pk=step1.pk).tool_call_ids == ["call_disk", "call_rot"]
    assert (step1.prompt_tokens, step1.completion_tokens, step1.reasoning_tokens, step1.cached_tokens) == (
        400,
        60,
        30,
        128,
    )
    assert step1.reasoning_available and step2.reasoning_available
    reasoning = AgentReasoningAudit.objects.get(run_id=run.run_id, step_index=1)
    assert reasoning.reasoning_content == THINKING  # whitespace-only deltas kept
    assert "lookup_knowledge" in reasoning.assistant_text  # the tool-call plan
    assert AgentReasoningAudit.objects.get(run_id=run.run_id, step_index=2).assistant_text == run.content

    # Tools: lifecycle, effective input, retrieval facts, bounded output that hashes the canonical result.
    tools = {t.tool_call_id: t for t in trace.tools}
    assert tools["call_disk"].input_params == {"query": "disk full /var/log", "top_k": 5}
    assert tools["call_rot"].input_params == {"query": "logrotate deleted files lsof", "top_k": 3}
    store = CanonicalStore(run.run_id)
    for tool in tools.values():
        assert tool.status == ToolStatus.SUCCEEDED and tool.step_index == 1 and tool.duration_ms is not None
        assert tool.retrieval_layer in ("L0", "L1", "L0+L1") and tool.l1_match_count >= 1
        result = store.get_result(tool.tool_call_id)
        from audit.payloads import canonical_json

        full = canonical_json(result)
        assert tool.output_sha256 == hashlib.sha256(full.encode()).hexdigest()
        assert tool.output_length == len(full) and result["items"]
    assert set(store.get_evidence(ids)) == set(ids)

    # The second agent request carried the assistant tool-call turn (with reasoning) and both results.
    messages = answer_request.messages
    assistant = next(m for m in messages if m["role"] == "assistant")
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_disk", "call_rot"]
    assert json.loads(assistant["tool_calls"][1]["function"]["arguments"])["top_k"] == 3
    assert assistant["reasoning_content"] == THINKING
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["call_disk", "call_rot"]
    assert all(r.include_usage for rs in llm.requests.values() for r in rs)
    assert llm.requests[AGENT][0].tools[0]["function"]["name"] == "lookup_knowledge"
    # The guard saw the answer and exactly the cited evidence, taken from the canonical store.
    guard_input = json.loads(llm.requests[GUARD][0].messages[-1]["content"])
    assert guard_input["answer"] == run.content and [e["id"] for e in guard_input["evidence"]] == ids[:2]

    # Token ledger and timing.
    assert (run.tokens_router, run.tokens_agent, run.tokens_guard) == (140, 460 + 980, 315)
    assert run.tokens_total == 140 + 460 + 980 + 315 and run.tokens_reasoning == 42
    assert run.tokens_cached_input == 128 and run.model_calls == 4 and run.usage_unavailable_calls == 0
    assert run.tokens_reconciled
    assert run.created_at <= run.started_at <= run.first_model_request_at <= run.first_output_at
    assert (
        run.first_output_at <= run.finished_at and run.total_duration_ms >= run.first_output_latency_ms >= 0
    )


def test_claim_is_exclusive_and_the_lease_is_released_at_the_end(llm, user, settings):
    llm.route("CHITCHAT")
    llm.add(AGENT, stream_answer("Hi! Ask me about an incident."))
    run = prepare_run(user=user, query="hello")
    DiagnosisRun.objects.filter(pk=run.pk).update(
        lease_owner="other:1:x", lease_expires_at=run.created_at.replace(year=2999)
    )
    with pytest.raises(RunNotClaimable):
        execute(run.run_id)
    assert not TraceEvent.objects.filter(run_id=run.run_id).exists()
    DiagnosisRun.objects.filter(pk=run.pk).update(lease_owner="", lease_expires_at=None)
    outcome, _sink = execute(run.run_id)
    assert outcome.status == RunStatus.SUCCESS
    run.refresh_from_db()
    assert run.lease_owner == "" and run.lease_expires_at is None
    with pytest.raises(RunNotClaimable):  # a finished run is never executed again
        execute(run.run_id)


@pytest.mark.parametrize("forgery", ["inserted", "question changed"])
def test_a_run_the_service_did_not_create_is_never_executed(llm, user, forgery):
    """Issue 43: a PENDING run row a database writer inserted (a copy of a real one under a new id), or
    a real one whose question was changed before a worker took it, carries no valid creation tag: the
    runtime ends it RUN_NOT_AUTHENTIC without a model call, a tool or a chain event."""
    from audit.verify.runs import verify_run
    from audit.write import RUN_NOT_AUTHENTIC

    real = prepare_run(user=user, query="hello")
    if forgery == "inserted":
        values = {f.attname: getattr(real, f.attname) for f in DiagnosisRun._meta.concrete_fields}
        values.pop("id")
        values.update(run_id=real.run_id[:-4] + "f0f0", query="Silence every alert for a week")
        run = DiagnosisRun.objects.create(**values)
    else:
        DiagnosisRun.objects.filter(pk=real.pk).update(query="Silence every alert for a week")
        run = real
    with pytest.raises(RunNotClaimable):
        execute(run.run_id)
    run.refresh_from_db()
    assert (run.status, run.error_code) == (RunStatus.FAILED, RUN_NOT_AUTHENTIC)
    assert not TraceEvent.objects.filter(run_id=run.run_id).exists() and not any(llm.requests.values())
    assert any("not created by the service" in p for p in verify_run(run.run_id).invalid)


# --------------------------------------------------------------------------------------------------
# Guards
# --------------------------------------------------------------------------------------------------
def test_uncited_answer_gets_one_repair_round_then_is_blocked(llm, corpus, user):
    llm.route("KNOWLEDGE")
    uncited = "Rotate the logs and free some space."
    llm.add(
        AGENT,
        stream_tool_calls([("call_1", "lookup_knowledge", '{"query": "disk full"}')]),
        stream_answer(uncited),
        stream_answer("Still no citation, sorry."),
    )
    run, outcome, sink = ask(user, "How do I free disk space?")
    assert outcome.status == RunStatus.SUCCESS and outcome.release_decision == ReleaseDecision.BLOCKED
    assert run.content == outcome.content == BLOCKED_MESSAGE == sink.events[-1].content
    initial = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.EVIDENCE_GUARD_INITIAL)
    retry = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.EVIDENCE_GUARD_RETRY)
    assert initial.status == retry.status == "FAIL" and initial.details["reasons"] == ["NO_CITATION"]
    assert not TraceEvent.objects.filter(
        run_id=run.run_id, event_type=EventType.SEMANTIC_GUARD_DECISION
    ).exists()
    assert GUARD not in llm.requests  # the semantic guard never ran
    repair = llm.requests[AGENT][2].messages
    assert repair[-2] == {"role": "assistant", "content": uncited}
    assert repair[-1]["role"] == "user" and repair[-1]["content"].startswith(prompts.REPAIR_MARKER)
    release = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RELEASE_DECISION)
    assert release.status == "BLOCKED" and release.details["evidenceGuard"] == "FAIL"
    assert AgentStep.objects.filter(run_id=run.run_id).count() == 3
    assert_complete_audit(run)


def test_unknown_citation_is_repaired_then_published(llm, corpus, user):
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls([("call_1", "lookup_knowledge", '{"query": "nginx 502 upstream"}')]),
        stream_answer("Nginx answers 502 when the upstream refuses the connection [kb:made-up#7]."),
        lambda request: stream_answer(
            f"Nginx answers 502 when the upstream refuses the connection [{evidence_ids(request)[0]}]."
        ),
    )
    llm.supported()
    run, outcome, _sink = ask(user, "Nginx returns 502")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED and "[kb:nginx-502#" in run.content
    initial = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.EVIDENCE_GUARD_INITIAL)
    assert initial.details["reasons"] == ["UNKNOWN_CITATION"] and initial.details["unknown"] == [
        "kb:made-up#7"
    ]
    assert "kb:made-up#7" in llm.requests[AGENT][2].messages[-1]["content"]
    retry = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.EVIDENCE_GUARD_RETRY)
    assert retry.status == "PASS"
    assert_complete_audit(run)


def test_semantic_guard_rejection_blocks(llm, corpus, user):
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls([("call_1", "lookup_knowledge", '{"query": "nginx 502"}')]),
        lambda request: stream_answer(f"Restart the whole datacenter [{evidence_ids(request)[0]}]."),
    )
    llm.add(
        GUARD,
        stream_answer(
            '```json\n{"supported": false, "unsupportedClaims": ["Restart the whole datacenter"], '
            '"reason": "not in the evidence"}\n```',
            usage=usage(200, 30),
        ),
    )
    run, outcome, _sink = ask(user, "Nginx returns 502")
    assert outcome.release_decision == ReleaseDecision.BLOCKED and run.content == BLOCKED_MESSAGE
    event = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.SEMANTIC_GUARD_DECISION)
    assert event.status == "FAIL" and event.details["unsupportedClaims"] == ["Restart the whole datacenter"]
    assert run.tokens_guard == 230 and run.usage_unavailable_calls == 3 and not run.tokens_reconciled


class _BrokenCache:
    """A canonical cache that really fails: Redis on a port where nothing listens."""

    settings = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {"socket_connect_timeout": 0.5},
    }


def test_canonical_store_failure_blocks_while_the_durable_audit_stays_complete(llm, corpus, user, settings):
    settings.CACHES = {**settings.CACHES, "canonical": _BrokenCache.settings}
    llm.route("DIAGNOSIS")
    llm.add(AGENT, parallel_lookups_with_reasoning(), cited_answer)
    run, outcome, _sink = ask(user, "The disk is full on /var/log")
    assert outcome.status == RunStatus.SUCCESS and outcome.release_decision == ReleaseDecision.BLOCKED
    assert run.content == BLOCKED_MESSAGE
    guard = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.EVIDENCE_GUARD_INITIAL)
    assert guard.status == "FAIL" and guard.details["reasons"] == ["CANONICAL_UNAVAILABLE"]
    # Not repairable: no repair round, no semantic guard.
    assert not TraceEvent.objects.filter(
        run_id=run.run_id, event_type=EventType.EVIDENCE_GUARD_RETRY
    ).exists()
    assert len(llm.requests[AGENT]) == 2 and GUARD not in llm.requests
    # The tools ran and are recorded as such, with the canonical failure noted.
    for tool in ToolInvocation.objects.filter(run_id=run.run_id):
        assert tool.status == ToolStatus.SUCCEEDED and tool.output_sha256
    terminal = TraceEvent.objects.filter(run_id=run.run_id, status="SUCCEEDED", event_type="TOOL_INVOCATION")
    assert all("canonical store unavailable" in e.summary for e in terminal)
    assert_complete_audit(run)
    assert run.audit_write_failures == 0


def test_audit_write_failure_is_counted_and_the_run_still_succeeds(llm, corpus, user, caplog):
    llm.route("DIAGNOSIS")
    llm.add(AGENT, parallel_lookups_with_reasoning(), cited_answer)
    llm.supported()
    with in_every_runtime_thread(FailInserts("diagnosis_trace_event", times=2)) as failing:
        run, outcome, _sink = ask(user, "The disk is full on /var/log")
    assert failing.fired == 2
    assert outcome.status == run.status == RunStatus.SUCCESS
    assert outcome.release_decision == ReleaseDecision.PUBLISHED and run.content == outcome.content
    assert run.audit_write_failures == 2
    trace = get_trace(run=run)
    assert trace.summary.persisted.events < trace.summary.expected.events
    assert not trace.summary.audit_complete and trace.summary.chain_valid and trace.summary.gaps
    events = _events(run.run_id)
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))  # gapless despite failures
    assert "audit write failed" in caplog.text and run.content not in caplog.text


# --------------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------------
def _registry_with(**tools):
    registry = default_registry().copy()
    for name, (func, timeout) in tools.items():
        registry.tool(
            name=name,
            description=f"test tool {name}",
            parameters={"type": "object", "properties": {"q": {"type": "string"}}},
            timeout=timeout,
        )(func)
    return registry


def test_tool_exception_bad_arguments_and_unknown_tool_fail_with_codes(llm, corpus, user):
    def explode(q: str = "") -> dict:
        raise RuntimeError("backend exploded: " + "x" * 5000)

    registry = _registry_with(explode=(explode, None))
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls(
            [
                ("c_boom", "explode", '{"q": "x"}'),
                ("c_bad", "lookup_knowledge", '{"query": 5}'),
                ("c_ghost", "no_such_tool", "{}"),
            ]
        ),
        stream_answer("The tools failed, so I cannot cite anything."),
        stream_answer("Still nothing to cite."),
    )
    run, outcome, sink = ask(user, "Why is it broken?", registry=registry)
    assert outcome.status == RunStatus.SUCCESS and outcome.release_decision == ReleaseDecision.BLOCKED
    tools = {t.tool_call_id: t for t in ToolInvocation.objects.filter(run_id=run.run_id)}
    assert {k: (t.status, t.error_code) for k, t in tools.items()} == {
        "c_boom": ("FAILED", "TOOL_ERROR"),
        "c_bad": ("FAILED", "TOOL_BAD_ARGUMENTS"),
        "c_ghost": ("FAILED", "TOOL_REFUSED"),
    }
    assert tools["c_boom"].error_message.startswith("RuntimeError: backend exploded")
    assert len(tools["c_boom"].error_message) <= 300
    assert "query must be of type string" in tools["c_bad"].error_message
    assert tools["c_bad"].input_params == {"query": 5}
    # The model got an error object for each call, in order.
    sent = [m for m in llm.requests[AGENT][1].messages if m["role"] == "tool"]
    assert [json.loads(m["content"])["error"]["code"] for m in sent] == [
        "TOOL_ERROR",
        "TOOL_BAD_ARGUMENTS",
        "TOOL_REFUSED",
    ]
    assert {(e.tool_call_id, e.status) for e in sink.of_type(ToolEvent)} >= {
        ("c_boom", "FAILED"),
        ("c_bad", "FAILED"),
        ("c_ghost", "FAILED"),
    }
    assert_complete_audit(run)


def test_tool_timeout_fails_the_tool_not_the_run(llm, corpus, user):
    release = threading.Event()

    def slow(q: str = "") -> dict:
        release.wait(10)
        return {"late": True}

    registry = _registry_with(slow=(slow, 0.2))
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls([("c_slow", "slow", "{}"), ("c_kb", "lookup_knowledge", '{"query": "nginx 502"}')]),
        lambda request: stream_answer(f"Check the upstream port [{evidence_ids(request)[0]}]."),
    )
    llm.supported()
    try:
        run, outcome, _sink = ask(user, "nginx 502 after deploy", registry=registry)
    finally:
        release.set()
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    slow_row = ToolInvocation.objects.get(run_id=run.run_id, tool_call_id="c_slow")
    assert slow_row.status == ToolStatus.FAILED and slow_row.error_code == "TOOL_TIMEOUT"
    assert 150 <= slow_row.duration_ms < 5000
    assert ToolInvocation.objects.get(run_id=run.run_id, tool_call_id="c_kb").status == ToolStatus.SUCCEEDED
    assert_complete_audit(run)


def test_cancel_during_a_slow_tool_interrupts_it_and_cancels_the_run(llm, corpus, user):
    release = threading.Event()
    started = threading.Event()

    def slow(q: str = "") -> dict:
        started.set()
        release.wait(10)
        return {}

    registry = _registry_with(slow=(slow, None))
    llm.route("DIAGNOSIS")
    llm.add(AGENT, stream_tool_calls([("c_slow", "slow", "{}")]))
    from agent.runtime.cancel import CancelToken

    token = CancelToken()

    class CancellingSink:
        def __init__(self):
            self.events = []

        async def emit(self, event):
            self.events.append(event)
            if isinstance(event, ToolEvent) and event.status == "RUNNING":
                # Cancel from outside the run once the tool is really executing (like a cancel frame).
                self.stopper = asyncio.get_running_loop().create_task(self.stop_when_started())

        async def stop_when_started(self):
            await asyncio.to_thread(started.wait, 5)
            token.cancel("user pressed stop")

    sink = CancellingSink()
    run = prepare_run(user=user, query="slow diagnosis")
    try:
        outcome, _ = execute(run.run_id, sink=sink, cancel=token, registry=registry)
    finally:
        release.set()
    run.refresh_from_db()
    assert outcome.status == run.status == RunStatus.CANCELLED
    assert run.release_decision is None and run.content == "" and outcome.content == ""
    tool = ToolInvocation.objects.get(run_id=run.run_id)
    assert tool.status == ToolStatus.INTERRUPTED and tool.error_code == "RUN_CANCELLED"
    assert started.is_set() and tool.duration_ms is not None
    types = _types(run.run_id)
    assert types[-2:] == ["RUN_CANCELLED", "RUN_FINISHED"] and "RELEASE_DECISION" not in types
    assert (
        TraceEvent.objects.get(run_id=run.run_id, event_type="RUN_CANCELLED").summary == "user pressed stop"
    )
    assert [(e.tool_call_id, e.status) for e in sink.events if isinstance(e, ToolEvent)] == [
        ("c_slow", "RUNNING"),
        ("c_slow", "INTERRUPTED"),
    ]
    assert isinstance(sink.events[-1], OutcomeEvent) and sink.events[-1].status == "CANCELLED"
    assert len(llm.requests[AGENT]) == 1
    assert_complete_audit(run)


def test_cancel_requested_column_is_picked_up_by_the_heartbeat(llm, corpus, user, settings):
    settings.RUN_LEASE_SECONDS = 0.3
    release = threading.Event()

    def slow(q: str = "") -> dict:
        DiagnosisRun.objects.filter(query="column cancel").update(cancel_requested=True)
        release.wait(10)
        return {}

    registry = _registry_with(slow=(slow, None))
    llm.route("DIAGNOSIS")
    llm.add(AGENT, stream_tool_calls([("c_slow", "slow", "{}")]))
    try:
        run, outcome, _sink = ask(user, "column cancel", registry=registry)
    finally:
        release.set()
    assert outcome.status == run.status == RunStatus.CANCELLED
    assert ToolInvocation.objects.get(run_id=run.run_id).status == ToolStatus.INTERRUPTED


# --------------------------------------------------------------------------------------------------
# Provider behaviour seen from the run
# --------------------------------------------------------------------------------------------------
def test_missing_usage_is_recorded_unavailable_and_not_reconciled(llm, corpus, user):
    llm.route("DIAGNOSIS")  # no usage on any call
    llm.add(
        AGENT,
        stream_tool_calls([("c1", "lookup_knowledge", '{"query": "nginx 502"}')]),
        lambda request: stream_answer(f"Check the upstream [{evidence_ids(request)[0]}]."),
    )
    llm.supported()
    run, outcome, _sink = ask(user, "nginx 502")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    assert run.model_calls == 4 and run.usage_unavailable_calls == 4
    assert run.tokens_total == 0 and not run.tokens_reconciled
    for step in AgentStep.objects.filter(run_id=run.run_id):
        assert step.usage_available is False and step.total_tokens is None and step.prompt_tokens is None
    usage_events = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.MODEL_TOKEN_USAGE)
    assert {e.status for e in usage_events} == {"UNAVAILABLE"} and usage_events.count() == 4
    assert_complete_audit(run)


def test_provider_without_reasoning_records_reasoning_unavailable(llm, corpus, user):
    llm.route("DIAGNOSIS", usage=usage(10, 5))
    llm.add(
        AGENT,
        stream_tool_calls([("c1", "lookup_knowledge", '{"query": "nginx 502"}')], usage=usage(50, 10)),
        lambda request: stream_answer(
            f"Check the upstream [{evidence_ids(request)[0]}].", usage=usage(90, 9)
        ),
    )
    llm.supported(usage=usage(30, 4))
    run, outcome, _sink = ask(user, "nginx 502")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED and run.tokens_reconciled
    for step in AgentStep.objects.filter(run_id=run.run_id):
        assert step.reasoning_available is False and step.reasoning_bytes == 0
    rows = AgentReasoningAudit.objects.filter(run_id=run.run_id, agent_name="diagnosis_agent")
    rows = rows.order_by("step_index")
    assert [r.reasoning_content for r in rows] == [None, None]
    assert [r.content_source for r in rows] == ["TOOL_CALL_PLAN", "ASSISTANT_TEXT"]
    assistant = next(m for m in llm.requests[AGENT][1].messages if m["role"] == "assistant")
    assert "reasoning_content" not in assistant  # nothing sent that a plain OpenAI model did not send
    assert run.tokens_reasoning is None and run.tokens_cached_input is None  # not reported: not 0


def test_deepseek_reasoning_round_trip_within_a_turn_never_into_the_next(llm, corpus, user):
    deepseek_usage = {
        "prompt_tokens": 500,
        "completion_tokens": 70,
        "total_tokens": 570,
        "prompt_cache_hit_tokens": 320,
        "prompt_cache_miss_tokens": 180,
        "completion_tokens_details": {"reasoning_tokens": 40},
    }
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls(
            [("call_0", "lookup_knowledge", '{"query": "nginx 502"}')],
            reasoning=THINKING,
            usage=deepseek_usage,
        ),
        lambda request: stream_answer(
            f"The upstream refused [{evidence_ids(request)[0]}].", reasoning="Done."
        ),
    )
    llm.supported()
    run, outcome, _sink = ask(user, "nginx 502 after deploy")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    second = llm.requests[AGENT][1].messages
    assistant = [m for m in second if m["role"] == "assistant"]
    assert len(assistant) == 1 and assistant[0]["reasoning_content"] == THINKING
    step1 = AgentStep.objects.get(run_id=run.run_id, step_index=1)
    assert step1.cached_tokens == 320 and step1.reasoning_tokens == 40
    assert run.tokens_cached_input == 320

    # The next turn of the session: the previous answer as context, no reasoning, no tool traffic.
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls(
            [("call_0", "lookup_knowledge", '{"query": "nginx upstream port"}')], reasoning="Again."
        ),
        lambda request: stream_answer(f"Check the port [{evidence_ids(request)[0]}]."),
    )
    llm.supported()
    _run2, outcome2, _ = ask(user, "and how do I check the port?", session_id=run.session_id)
    assert outcome2.release_decision == ReleaseDecision.PUBLISHED
    first_of_turn = llm.requests[AGENT][2].messages
    assert [m["role"] for m in first_of_turn] == ["system", "user", "assistant", "user"]
    assert first_of_turn[1]["content"] == run.query and first_of_turn[2] == {
        "role": "assistant",
        "content": run.content,
    }
    assert "reasoning_content" not in json.dumps(first_of_turn)
    # Within the new turn the round trip happens again, with that turn's own reasoning.
    later = [m for m in llm.requests[AGENT][3].messages if m.get("reasoning_content")]
    assert [m["reasoning_content"] for m in later] == ["Again."]
    # The router saw the earlier question too.
    assert run.query in llm.requests[ROUTER][1].messages[-1]["content"]


def test_router_parse_failure_retries_then_falls_back_to_diagnosis(llm, corpus, user):
    llm.add(ROUTER, stream_answer("It is a diagnosis, I think."), stream_answer('{"intent": "WEATHER"}'))
    llm.add(
        AGENT,
        stream_tool_calls([("c1", "lookup_knowledge", '{"query": "nginx 502"}')]),
        lambda request: stream_answer(f"Check the upstream [{evidence_ids(request)[0]}]."),
    )
    llm.supported()
    run, outcome, _sink = ask(user, "something odd with nginx")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED and run.intent == "DIAGNOSIS"
    attempts = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.ROUTING_ATTEMPT).order_by(
        "sequence_no"
    )
    assert [a.status for a in attempts] == ["INVALID", "INVALID"]
    assert (
        "no JSON object" in attempts[0].details["error"] and "unknown intent" in attempts[1].details["error"]
    )
    decision = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.ROUTING_DECISION)
    assert decision.status == "FALLBACK" and decision.details["fallback"] is True
    assert decision.details["intent"] == "DIAGNOSIS"
    retry = llm.requests[ROUTER][1].messages
    assert retry[-1] == {"role": "user", "content": prompts.ROUTER_RETRY}
    assert run.model_calls == 5


def test_chitchat_is_answered_with_fixed_text_without_tools_or_evidence(llm, user):
    llm.route("CHITCHAT", confidence=0.97)
    run, outcome, sink = ask(user, "hi there")
    assert outcome.status == RunStatus.SUCCESS and outcome.release_decision == ReleaseDecision.PUBLISHED
    assert run.intent == "CHITCHAT" and run.content == fixed_reply("CHITCHAT", "hi there")
    assert not sink.of_type(DraftEvent) and sink.events[-1].content == run.content
    assert AGENT not in llm.requests and GUARD not in llm.requests
    assert not ToolInvocation.objects.filter(run_id=run.run_id).exists()
    guard = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.EVIDENCE_GUARD_INITIAL)
    assert guard.status == "PASS" and guard.details["required"] is False
    assert not sink.of_type(ToolEvent)
    assert_complete_audit(run)


def test_provider_failing_until_retries_run_out_fails_the_run_with_its_code(llm, user, settings):
    settings.LLM_MAX_RETRIES = 2
    llm.route("KNOWLEDGE", usage=usage(10, 2))
    fast = {"retry-after-ms": "1"}
    llm.add(AGENT, HTTPError(500, headers=fast), HTTPError(503, headers=fast), HTTPError(502, headers=fast))
    run, outcome, sink = ask(user, "hello")
    assert outcome.status == run.status == RunStatus.FAILED
    assert outcome.error_code == run.error_code == "LLM_UNAVAILABLE"
    assert "3 attempts" in run.error_message and run.release_decision is None and run.content == ""
    assert [type(e) for e in sink.events[-2:]] == [ErrorEvent, OutcomeEvent]
    assert sink.events[-2].code == "LLM_UNAVAILABLE" and sink.events[-1].status == "FAILED"
    step = AgentStep.objects.get(run_id=run.run_id)
    assert step.finish_reason == "error" and not step.usage_available
    assert [a.get("status") for a in AgentStep.objects.get(pk=step.pk).attempts] == [500, 503, 502]
    assert not run.tokens_reconciled and run.usage_unavailable_calls == 1
    assert_complete_audit(run)


def test_rate_limit_then_success_is_visible_in_the_step_attempts(llm, user):
    llm.route("KNOWLEDGE", usage=usage(10, 2))
    llm.add(
        AGENT,
        HTTPError(429, headers={"retry-after-ms": "5"}),
        stream_answer("Hi!", usage=usage(5, 2)),
        stream_answer("Still uncited.", usage=usage(6, 2)),
    )
    run, outcome, _ = ask(user, "hello")
    assert outcome.status == RunStatus.SUCCESS and outcome.release_decision == ReleaseDecision.BLOCKED
    attempts = AgentStep.objects.get(run_id=run.run_id, step_index=1).attempts
    assert [(a["attempt"], a.get("status")) for a in attempts] == [(1, 429), (2, 200)]
    assert attempts[0]["error"] == "RateLimitError" and attempts[0]["retryInMs"] == 5
    assert run.tokens_reconciled  # the failed attempt consumed no usage; the call reported its own


def test_unexpected_exception_fails_the_run_with_internal_error_without_details(llm, user, caplog):
    class BuggyRegistry(ToolRegistry):
        """A programming error inside the pipeline (the tool lookup raises)."""

        def get(self, name):
            raise ZeroDivisionError("secret detail")

    registry = BuggyRegistry([ToolRegistry.get(default_registry(), n) for n in default_registry().names()])
    llm.route("DIAGNOSIS")
    llm.add(AGENT, stream_tool_calls([("c1", "lookup_knowledge", '{"query": "x"}')]))
    run, outcome, sink = ask(user, "boom", registry=registry)
    assert outcome.status == run.status == RunStatus.FAILED and run.error_code == "INTERNAL_ERROR"
    assert outcome.error_message == run.error_message == "The run failed because of an internal error."
    assert "secret detail" not in caplog.text and "Traceback" not in caplog.text
    assert f"run failed run={run.run_id} error=ZeroDivisionError" in caplog.text
    assert isinstance(sink.events[0], RunEvent)
    assert [type(e) for e in sink.events[-2:]] == [ErrorEvent, OutcomeEvent]
    assert sink.events[-1].status == "FAILED" and sink.events[-1].release_decision is None
    assert _types(run.run_id)[-1] == "RUN_FINISHED"
    assert_complete_audit(run)


# --------------------------------------------------------------------------------------------------
# Database work per model step
# --------------------------------------------------------------------------------------------------
def _tool_rounds(rounds):
    def agent_script():
        scripts = [
            stream_tool_calls(
                [(f"call_{i}", "lookup_knowledge", '{"query": "nginx 502"}')], usage=usage(10, 5)
            )
            for i in range(rounds)
        ]
        scripts.append(
            lambda request: stream_answer(f"Check it [{evidence_ids(request)[0]}].", usage=usage(9, 3))
        )
        return scripts

    return agent_script()


def test_database_statements_per_model_step_are_bounded(llm, corpus, user, monkeypatch):
    from agent.knowledge import retrieval
    from agent.knowledge.retrieval import search_knowledge

    # Building the index is not per-step work, nor is its freshness check, which runs once per
    # VERSION_CHECK_SECONDS of wall time (on a loaded machine it fell inside one run and not the other).
    monkeypatch.setattr(retrieval, "VERSION_CHECK_SECONDS", 3600.0)
    search_knowledge("warm the retrieval index")
    counts = {}
    for rounds in (1, 3):
        llm.route("DIAGNOSIS", usage=usage(5, 5))
        llm.add(AGENT, *_tool_rounds(rounds))
        llm.supported(usage=usage(5, 5))
        with in_every_runtime_thread(SqlLog()) as log:
            _run, outcome, _ = ask(user, f"nginx 502 ({rounds})")
        assert outcome.release_decision == ReleaseDecision.PUBLISHED
        statements = [
            s for s in log.statements if not s.upper().startswith(("BEGIN", "SAVEPOINT", "RELEASE"))
        ]
        counts[rounds] = len(statements)
        assert (
            log.count("INSERT INTO")
            and log.count('INSERT INTO "agent_step"') + log.count("INSERT INTO `agent_step`") == rounds + 1
        )
    # Each extra model step with one tool call costs: the step (step row, reasoning row, its two events in
    # one bulk insert: one transaction), the tool's start (row + event) and terminal (update + event).
    # Each model call is also counted when it starts (one small update), so that a call lost with its
    # process is visible.
    per_step = (counts[3] - counts[1]) / 2
    assert per_step <= 8, counts
    # The whole run: claim, run start, history, routing, two steps, one tool, guards, release, finish
    # (with its one reconciliation read, its one read of the price overrides for the run's cost, and the
    # list facts and the review queue's flag in its transaction), and the run's configuration kept once
    # (one INSERT that ignores a row already there: `diagnosis.services.remember_configuration`).
    assert counts[1] <= 35, counts


def test_a_run_cancelled_before_it_started_stops_at_the_first_safe_point(llm, user):
    run = prepare_run(user=user, query="never mind")
    DiagnosisRun.objects.filter(pk=run.pk).update(cancel_requested=True)
    outcome, sink = execute(run.run_id)
    assert outcome.status == RunStatus.CANCELLED and not llm.requests
    assert _types(run.run_id) == ["RUN_STARTED", "RUN_CANCELLED", "RUN_FINISHED"]
    assert [type(e) for e in sink.events] == [RunEvent, OutcomeEvent]


def test_the_last_allowed_step_must_answer(llm, corpus, user, settings):
    settings.AGENT_MAX_STEPS = 2
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls([("c1", "lookup_knowledge", '{"query": "nginx 502"}')]),
        lambda request: stream_answer(f"Check the upstream [{evidence_ids(request)[0]}]."),
    )
    llm.supported()
    _run, outcome, _ = ask(user, "nginx 502")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    first, last = llm.requests[AGENT]
    assert "tool_choice" not in first.json and last.json["tool_choice"] == "none" and last.tools


def test_router_provider_failure_fails_the_run(llm, user):
    llm.add(ROUTER, HTTPError(401))
    run, outcome, sink = ask(user, "nginx 502")
    assert outcome.status == run.status == RunStatus.FAILED and run.error_code == "LLM_REJECTED"
    attempt = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.ROUTING_ATTEMPT)
    assert attempt.status == "INVALID" and attempt.details["error"] == "LLM_REJECTED"
    assert attempt.details["providerAttempts"][0]["status"] == 401
    assert AGENT not in llm.requests and run.intent is None
    assert [type(e) for e in sink.events] == [RunEvent, ProgressEvent, ErrorEvent, OutcomeEvent]
    assert (sink.events[1].stage, sink.events[1].status) == ("ROUTING", "STARTED")
    assert_complete_audit(run)
