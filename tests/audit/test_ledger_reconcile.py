"""Token reconciliation re-reads what is stored: a stored step or usage record that disagrees with the
ledger is named, reasoning and cached tokens a provider did not report are null at every level, a total
is never invented from a missing part, and a model call started but never recorded (its process died)
shows as a call without usage instead of vanishing."""

import datetime as dt

import pytest
from django.utils import timezone

from agent.runtime.sweeper import sweep_expired_runs
from audit.models import AgentStep, EventType, TraceEvent
from audit.read import get_trace
from audit.write import RunRecorder, Usage
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.capture import build_capture
from surfaces.api.audit_serializers import TraceSerializer
from surfaces.api.trace_render import trace_data
from tests.agent.runtime.support import AGENT, GUARD, ROUTER, ask, evidence_ids
from tests.fakes.openai_server import (
    stream_answer,
    stream_tool_calls,
    usage,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]


def _trace_body(run):
    run.refresh_from_db()
    trace = get_trace(run=run)
    body = TraceSerializer(trace).data
    assert trace_data(trace) == body  # the fast path renders the ledger exactly like the serializer
    return trace, body


def _script_cited_run(llm, *, agent_usage=None, reasoning=None):
    llm.route("DIAGNOSIS", usage=usage(40, 10))
    llm.add(
        AGENT,
        stream_tool_calls(
            [("call_1", "lookup_knowledge", '{"query": "disk full /var/log"}')],
            usage=agent_usage or usage(200, 20),
        ),
        lambda request: stream_answer(
            f"Find the largest log directories with du [{evidence_ids(request)[0]}].",
            reasoning=reasoning,
            usage=usage(300, 30, reasoning=7) if reasoning else usage(300, 30),
        ),
    )
    llm.supported(usage=usage(100, 10))


# --------------------------------------------------------------------------------------------------
# Stored rows against the ledger
# --------------------------------------------------------------------------------------------------
def test_a_stored_step_whose_tokens_differ_from_the_ledger_is_named_and_not_reconciled(llm, corpus, user):
    _script_cited_run(llm)
    run, outcome, _ = ask(user, "Disk full on /var/log")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED and run.tokens_reconciled
    _trace, body = _trace_body(run)
    assert body["run"]["tokens"]["reconciled"] is True and body["run"]["tokens"]["differences"] == []
    assert body["run"]["tokens"]["modelCalls"] == 4

    step = AgentStep.objects.get(run_id=run.run_id, step_index=1)
    AgentStep.objects.filter(pk=step.pk).update(total_tokens=step.total_tokens - 100)
    _trace, body = _trace_body(run)
    tokens = body["run"]["tokens"]
    assert tokens["reconciled"] is False
    assert tokens["differences"] == [
        "agent step 1: step row total_tokens 120 differs from its usage record 220"
    ]
    assert tokens["differences"][0] in body["summary"]["gaps"]

    AgentStep.objects.filter(pk=step.pk).update(total_tokens=step.total_tokens)
    _trace, body = _trace_body(run)
    assert body["run"]["tokens"]["reconciled"] is True


def test_a_changed_usage_record_or_ledger_column_is_named(llm, corpus, user):
    _script_cited_run(llm)
    run, _outcome, _ = ask(user, "Disk full on /var/log")
    router_usage = TraceEvent.objects.get(
        run_id=run.run_id, event_type=EventType.MODEL_TOKEN_USAGE, details__source="ROUTER"
    )
    details = {**router_usage.details, "totalTokens": 5}
    TraceEvent.objects.filter(pk=router_usage.pk).update(details=details)
    _trace, body = _trace_body(run)
    assert body["run"]["tokens"]["reconciled"] is False
    assert (
        "ledger router tokens 50 differ from the stored usage records (5)"
        in body["run"]["tokens"]["differences"]
    )

    TraceEvent.objects.filter(pk=router_usage.pk).update(details=router_usage.details)
    DiagnosisRun.objects.filter(pk=run.pk).update(tokens_agent=1)
    _trace, body = _trace_body(run)
    assert (
        "ledger agent tokens 1 differ from the stored usage records (550)"
        in body["run"]["tokens"]["differences"]
    )


def test_finish_rereads_the_stored_rows_and_records_a_disagreement(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    rec.model_call_started()
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=Usage(available=True, prompt_tokens=10, completion_tokens=5, total_tokens=15),
        reasoning=build_capture(reasoning=None, text="answer"),
        finish_reason="stop",
    )
    # The stored step row no longer says what the provider reported before the run finishes.
    AgentStep.objects.filter(run_id=run.run_id).update(completion_tokens=50, total_tokens=60)
    rec.finish(status=RunStatus.SUCCESS, content="answer")
    run.refresh_from_db()
    assert run.tokens_total == 15 and run.model_calls == 1 and not run.tokens_reconciled
    finished = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_FINISHED)
    assert finished.details["tokensReconciled"] is False
    _trace, body = _trace_body(run)
    assert body["run"]["tokens"]["reconciled"] is False
    assert (
        "agent step 1: step row total_tokens 60 differs from its usage record 15"
        in (body["run"]["tokens"]["differences"])
    )


# --------------------------------------------------------------------------------------------------
# Unreported counts are null, never 0; no invented totals
# --------------------------------------------------------------------------------------------------
def test_unreported_reasoning_and_cached_tokens_are_null_at_every_level(llm, corpus, user):
    _script_cited_run(llm)  # no call reports reasoning or cached tokens
    run, outcome, _ = ask(user, "Disk full on /var/log")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    steps = AgentStep.objects.filter(run_id=run.run_id)
    assert steps.count() == 2 and all(s.reasoning_tokens is None and s.cached_tokens is None for s in steps)
    events = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.MODEL_TOKEN_USAGE)
    assert events.count() == 4
    assert all(e.details["reasoningTokens"] is None and e.details["cachedTokens"] is None for e in events)
    assert run.tokens_reasoning is None and run.tokens_cached_input is None and run.tokens_reconciled
    _trace, body = _trace_body(run)
    tokens = body["run"]["tokens"]
    assert tokens["reasoning"] is None and tokens["cachedInput"] is None
    assert tokens["reasoningUnreportedCalls"] == tokens["cachedUnreportedCalls"] == 4
    assert all(s["reasoningTokens"] is None and s["cachedTokens"] is None for s in body["steps"])


def test_reasoning_reported_by_some_calls_is_summed_with_the_count_of_calls_that_lacked_it(llm, corpus, user):
    _script_cited_run(llm, agent_usage=usage(200, 20, cached=64), reasoning="Cite the runbook.")
    run, _outcome, _ = ask(user, "Disk full on /var/log")
    assert run.tokens_reasoning == 7 and run.tokens_cached_input == 64 and run.tokens_reconciled
    _trace, body = _trace_body(run)
    tokens = body["run"]["tokens"]
    assert (tokens["reasoning"], tokens["reasoningUnreportedCalls"]) == (7, 3)
    assert (tokens["cachedInput"], tokens["cachedUnreportedCalls"]) == (64, 3)


def test_a_usage_without_total_or_completion_is_never_completed_with_zeros(llm, user):
    # The router's usage names only its prompt tokens: the total cannot be known.
    route = '{"intent": "CHITCHAT", "confidence": 0.9, "reason": "greeting"}'
    llm.add(ROUTER, stream_answer(route, usage={"prompt_tokens": 12}))
    run, outcome, _ = ask(user, "hello")
    assert outcome.status == RunStatus.SUCCESS
    event = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.MODEL_TOKEN_USAGE)
    assert event.details["usageAvailable"] is True and event.details["promptTokens"] == 12
    assert event.details["totalTokens"] is None and event.details["completionTokens"] is None
    assert run.tokens_router == 0 and run.usage_unavailable_calls == 1 and not run.tokens_reconciled
    _trace, body = _trace_body(run)
    assert body["run"]["tokens"]["callsWithoutUsage"] == ["router call 1"]
    assert "router call 1 reported no token usage" in body["summary"]["gaps"]
    assert body["summary"]["auditComplete"] is True  # a provider gap, faithfully recorded
    assert GUARD not in llm.requests


# --------------------------------------------------------------------------------------------------
# Calls are counted as they start
# --------------------------------------------------------------------------------------------------
def test_a_model_call_started_but_never_recorded_shows_as_unavailable(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    rec.model_call_started()
    rec.routing_attempt(
        attempt=1, model="router-m", usage=Usage(True, 10, 2, 12), ok=True, intent="DIAGNOSIS", confidence=0.9
    )
    rec.routing_decision(intent="DIAGNOSIS", confidence=0.9, reason="symptom", fallback=False)
    rec.model_call_started()  # the agent call is sent ... and the process dies before it is recorded
    run.refresh_from_db()
    assert run.model_calls == 2 and run.first_model_request_at is not None

    DiagnosisRun.objects.filter(pk=run.pk).update(
        lease_owner="dead:1:x", lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert sweep_expired_runs() == [run.run_id]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.model_calls == 2
    assert run.usage_unavailable_calls == 1 and run.tokens_router == 12 and not run.tokens_reconciled
    finished = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_FINISHED)
    assert finished.details["modelCalls"] == 2 and finished.details["unavailableCalls"] == 1
    trace, body = _trace_body(run)
    tokens = body["run"]["tokens"]
    assert tokens["unavailableCalls"] == 1 and tokens["usageAvailable"] is False
    assert tokens["callsWithoutUsage"] == ["1 model call started but never recorded (no token usage)"]
    assert tokens["reasoningUnreportedCalls"] == 2  # the router reported none, the lost call nothing
    assert "1 model call started but never recorded (no token usage)" in trace.summary.gaps


def test_a_deleted_step_row_or_usage_record_is_named(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    for step_index in (1, 2):
        rec.model_call_started()
        rec.model_step(
            step_index=step_index,
            agent_name="diagnosis_agent",
            model="agent-m",
            usage=Usage(available=True, prompt_tokens=10, completion_tokens=5, total_tokens=15),
            reasoning=build_capture(reasoning=None, text="answer"),
            finish_reason="stop",
        )
    rec.finish(status=RunStatus.SUCCESS, content="answer")
    run.refresh_from_db()
    assert run.tokens_reconciled and get_trace(run=run).summary.ledger.reconciled

    AgentStep.objects.filter(run_id=run.run_id, step_index=2).delete()
    ledger = get_trace(run=run).summary.ledger
    assert not ledger.reconciled and ledger.differences == ["agent step 2: usage record has no step row"]

    TraceEvent.objects.filter(
        run_id=run.run_id, event_type=EventType.MODEL_TOKEN_USAGE, details__stepIndex=1
    ).delete()
    ledger = get_trace(run=run).summary.ledger
    assert "agent step 1: step row has no usage record" in ledger.differences
    assert "1 model call started but never recorded (no token usage)" in ledger.without_usage


def test_usage_and_call_usage_and_the_step_row_carry_exactly_the_one_usage_field_set():
    """`audit.verify.reconcile.USAGE_FIELDS` is the one list of a call's counts: the provider's `Usage`, the
    stored record's `CallUsage` and the step row's columns each hold exactly those, and `Usage.as_details`
    writes them under its keys (what is hashed into MODEL_TOKEN_USAGE)."""
    from dataclasses import fields

    from audit.verify.reconcile import USAGE_FIELDS, CallUsage

    attrs = [attr for _key, attr in USAGE_FIELDS]
    assert [f.name for f in fields(Usage)] == ["available", *attrs]
    assert [f.name for f in fields(CallUsage)][:6] == ["available", *attrs]
    assert all(hasattr(AgentStep, attr) for attr in attrs)
    details = Usage(True, 1, 2, 3, 4, 5).as_details()
    assert details == {
        "usageAvailable": True,
        "promptTokens": 1,
        "completionTokens": 2,
        "totalTokens": 3,
        "reasoningTokens": 4,
        "cachedTokens": 5,
    }
    assert list(details) == ["usageAvailable", *(key for key, _attr in USAGE_FIELDS)]
    assert CallUsage.from_details({"source": "AGENT", **details}).counts() == (True, 1, 2, 3, 4, 5)
