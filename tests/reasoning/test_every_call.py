"""Every model call's reasoning is captured under seed 000's rules: router attempts (agent_name `router`)
and semantic guard calls (`semantic_guard`) beside the agent steps, each row written in the transaction
of its decision's event, with step indexes that cannot collide with agent steps; the auditor API returns
them in call order. The trace names the run's provider and marks the offline demo model as demo."""

import io
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command

from audit.models import EventType, TraceEvent
from audit.read import get_trace
from audit.write.runtime_facts import guard_reasoning_step, router_reasoning_step
from diagnosis.models import ReleaseDecision
from reasoning.models import AgentReasoningAudit
from surfaces.api.audit_serializers import TraceSerializer
from surfaces.api.trace_render import trace_data
from tests.agent.runtime.support import (
    GUARD_THINKING,
    ROUTE,
    ROUTER_THINKING,
    VERDICT,
    FailInserts,
    ask,
    in_every_runtime_thread,
    script_reasoned_diagnosis,
)
from tests.fakes.openai_server import stream_answer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]

RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"


def test_router_and_guard_reasoning_is_captured_and_returned_to_auditors(
    llm, corpus, user, api_client, auditor
):
    script_reasoned_diagnosis(llm)
    run, outcome, _ = ask(user, "Disk full on /var/log")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED

    rows = list(AgentReasoningAudit.objects.filter(run_id=run.run_id).order_by("id"))
    assert [(r.agent_name, r.step_index) for r in rows] == [
        ("router", -1),
        ("diagnosis_agent", 1),
        ("diagnosis_agent", 2),
        ("semantic_guard", -101),
    ]
    router, guard = rows[0], rows[-1]
    assert router.reasoning_available and router.reasoning_content == ROUTER_THINKING
    assert router.assistant_text == ROUTE and router.content_source == "PROVIDER_REASONING+ASSISTANT_TEXT"
    assert router.content_bytes == len(ROUTER_THINKING.encode()) + len(ROUTE.encode())
    assert guard.reasoning_content == GUARD_THINKING and guard.assistant_text == VERDICT
    assert not rows[2].reasoning_available and rows[2].reasoning_content is None  # nothing synthesised

    # The decision events carry the rows' metadata only, never their text.
    attempt = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.ROUTING_ATTEMPT)
    decision = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.SEMANTIC_GUARD_DECISION)
    assert attempt.details["reasoningStepIndex"] == -1 and attempt.details["reasoningAvailable"] is True
    assert decision.details["reasoningStepIndex"] == -101
    assert decision.details["reasoningBytes"] == len(GUARD_THINKING.encode())
    for event in TraceEvent.objects.filter(run_id=run.run_id):
        assert ROUTER_THINKING not in str(event.details) and GUARD_THINKING not in str(event.details)

    api_client.force_login(auditor)
    response = api_client.get(f"/api/diagnosis/{run.session_id}/trace/reasoning?runId={run.run_id}")
    assert response.status_code == 200
    records = response.json()["records"]
    assert [(r["agentName"], r["stepIndex"]) for r in records] == [
        ("router", -1),
        ("diagnosis_agent", 1),
        ("diagnosis_agent", 2),
        ("semantic_guard", -101),
    ]
    assert records[0]["reasoningContent"] == ROUTER_THINKING
    assert get_trace(run=run).summary.audit_complete


def test_every_router_attempt_keeps_its_own_reasoning_row(llm, corpus, user):
    script_reasoned_diagnosis(
        llm, router_first=stream_answer("I think it is a diagnosis.", reasoning="Unsure of the format.")
    )
    run, _outcome, _ = ask(user, "Disk full on /var/log")
    rows = AgentReasoningAudit.objects.filter(run_id=run.run_id, agent_name="router").order_by("id")
    assert [(r.step_index, r.reasoning_content) for r in rows] == [
        (-1, "Unsure of the format."),
        (-2, ROUTER_THINKING),
    ]
    assert [router_reasoning_step(1), router_reasoning_step(2), guard_reasoning_step(1)] == [-1, -2, -101]


def test_a_reasoning_row_commits_with_its_decision_event_or_not_at_all(llm, corpus, user):
    script_reasoned_diagnosis(llm)
    with in_every_runtime_thread(FailInserts("agent_reasoning_audit", times=1)) as failing:
        run, outcome, _ = ask(user, "Disk full on /var/log")
    assert failing.fired == 1 and outcome.release_decision == ReleaseDecision.PUBLISHED
    assert run.audit_write_failures == 1
    # Every stored decision event has its reasoning row and every row its event: the one rejected
    # reasoning insert took its decision's events with it (one transaction), and nothing else.
    rows = set(AgentReasoningAudit.objects.filter(run_id=run.run_id).values_list("agent_name", "step_index"))
    events = TraceEvent.objects.filter(run_id=run.run_id)
    decided = {
        ("router", e.details["reasoningStepIndex"])
        for e in events.filter(event_type=EventType.ROUTING_ATTEMPT)
    }
    decided |= {
        ("semantic_guard", e.details["reasoningStepIndex"])
        for e in events.filter(event_type=EventType.SEMANTIC_GUARD_DECISION)
    }
    decided |= {
        ("diagnosis_agent", e.details["stepIndex"])
        for e in events.filter(event_type=EventType.AGENT_MODEL_STEP)
    }
    assert rows == decided and len(rows) == 3  # four model calls, one decision lost whole
    summary = get_trace(run=run).summary
    assert not summary.audit_complete and "2 timeline events expected but not stored" in summary.gaps


# --------------------------------------------------------------------------------------------------
# Provider label
# --------------------------------------------------------------------------------------------------
def test_the_trace_names_a_real_provider_without_the_demo_mark(llm, corpus, user):
    script_reasoned_diagnosis(llm)
    run, _outcome, _ = ask(user, "Disk full on /var/log")
    trace = get_trace(run=run)
    body = TraceSerializer(trace).data
    assert body["run"]["provider"] == {"name": "openai", "demo": False}
    assert trace_data(trace) == body


def test_the_demo_provider_is_labelled_demo_in_the_trace(settings, user):
    settings.LLM_PROVIDER = "demo"
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    run, _outcome, _ = ask(user, "Nginx returns 502 Bad Gateway after the deploy")
    trace = get_trace(run=run)
    body = TraceSerializer(trace).data
    assert body["run"]["provider"] == {"name": "demo", "demo": True}
    assert trace_data(trace) == body
    names = set(AgentReasoningAudit.objects.filter(run_id=run.run_id).values_list("agent_name", flat=True))
    assert names == {"router", "diagnosis_agent", "semantic_guard"}


def test_router_and_guard_reasoning_rows_are_bound_into_the_chain(llm, corpus, user):
    script_reasoned_diagnosis(llm)
    run, _outcome, _ = ask(user, "Disk full on /var/log")
    summary = get_trace(run=run).summary
    assert summary.audit_complete and summary.rows_verified, summary.gaps
    assert summary.rows_verified_count == 8  # 2 steps, 1 tool, 4 reasoning rows, the run's summary

    guard = AgentReasoningAudit.objects.get(run_id=run.run_id, agent_name="semantic_guard")
    AgentReasoningAudit.objects.filter(pk=guard.pk).update(content_bytes=guard.content_bytes + 1)
    summary = get_trace(run=run).summary
    assert not summary.audit_complete and not summary.rows_verified
    assert any("reasoning row for step -101 (semantic_guard)" in gap for gap in summary.gaps), summary.gaps

    AgentReasoningAudit.objects.filter(pk=guard.pk).update(content_bytes=guard.content_bytes)
    AgentReasoningAudit.objects.filter(run_id=run.run_id, agent_name="router").delete()
    summary = get_trace(run=run).summary
    assert not summary.audit_complete
    assert any("reasoning row for step -1 (router) missing" in gap for gap in summary.gaps), summary.gaps
