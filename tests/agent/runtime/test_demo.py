"""The offline `demo` provider: its three roles on their own, and whole runs through the real pipeline
against the real runbook corpus."""

import io
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command

from agent.runtime.demo import (
    DEMO_QUESTIONS,
    DemoModelClient,
    answer_from_evidence,
    check_claims,
    count_tokens,
    route,
)
from agent.runtime.events import DraftEvent, OutcomeEvent, ProgressEvent, ToolEvent
from agent.runtime.pipeline import BLOCKED_MESSAGE
from audit.models import AgentStep, EventType, ToolInvocation, TraceEvent
from audit.read import get_trace
from diagnosis.models import ReleaseDecision, RunStatus
from reasoning.models import AgentReasoningAudit
from tests.agent.runtime.support import ask

RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"

pytestmark = pytest.mark.usefixtures("runtime_pools")


@pytest.fixture
def demo(settings):
    settings.LLM_PROVIDER = "demo"
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())


@pytest.mark.parametrize(
    "query,intent",
    [
        ("hello there", "CHITCHAT"),
        ("你好", "CHITCHAT"),
        ("write a poem about the sea", "OUT_OF_SCOPE"),
        ("How do I rotate logs with logrotate?", "KNOWLEDGE"),
        ("Nginx returns 502 after the deploy", "DIAGNOSIS"),
        ("Redis 连接超时怎么排查？", "DIAGNOSIS"),
    ],
)
def test_demo_router_heuristics(query, intent):
    assert route(query)["intent"] == intent


def test_demo_guard_checks_each_claim_against_the_evidence_it_cites():
    evidence = [
        {"id": "kb:a#1", "title": "Disk full", "heading": "Fix", "text": "Truncate the runaway log file."}
    ]
    ok = check_claims("From the runbooks:\n- Truncate the runaway log file. [kb:a#1]", evidence)
    assert ok["supported"] and ok["unsupportedClaims"] == []
    bad = check_claims(
        "Reboot every database server tonight [kb:a#1]. Truncate the runaway log file [kb:a#1].", evidence
    )
    assert not bad["supported"] and bad["unsupportedClaims"] == ["Reboot every database server tonight"]
    uncited = check_claims("Truncate the runaway log file now.", evidence)
    assert not uncited["supported"]


def test_demo_guard_refuses_a_claim_that_a_failed_action_happened():
    evidence = [
        {"id": "kb:a#1", "title": "Slow scrapes", "heading": "Fix", "text": "Check the scrape duration."}
    ]
    failed = [{"tool": "create_silence", "errorCode": "TOOL_ERROR", "action": True}]
    claimed = check_claims(
        "The alert was silenced for 30 minutes. Check the scrape duration. [kb:a#1]", evidence, failed
    )
    assert not claimed["supported"]
    assert claimed["unsupportedClaims"] == ["The alert was silenced for 30 minutes"]
    # Saying it did not happen is no claim that it did; a failed read is not an action.
    honest = "The silence was not created. Check the scrape duration. [kb:a#1]"
    assert check_claims(honest, evidence, failed)["supported"]
    reads = [{"tool": "query_metrics", "errorCode": "TOOL_ERROR", "action": False}]
    assert check_claims("Check the scrape duration. [kb:a#1]", evidence, reads)["supported"]


def test_demo_answers_only_from_relevant_evidence():
    items = [
        {"id": "kb:inode#3", "title": "Inode exhaustion", "heading": "Causes", "text": "Many small files."}
    ]
    assert answer_from_evidence("How do I configure SAML for Grafana?", items) == ("", [])
    text, used = answer_from_evidence("too many small files inode", items)
    assert used == ["kb:inode#3"] and text.endswith("[kb:inode#3]")
    assert count_tokens("Disk 满了 !") == 4


@pytest.mark.django_db(transaction=True)
def test_demo_runs_end_to_end(demo, user):
    # A runbook question: tool call, cited answer, both guards, published; the reader saw the stages.
    run, outcome, sink = ask(user, DEMO_QUESTIONS[0])
    assert outcome.status == RunStatus.SUCCESS and run.release_decision == ReleaseDecision.PUBLISHED
    assert "[kb:disk-full-var-log#" in run.content and run.intent == "DIAGNOSIS"
    assert not sink.of_type(DraftEvent) and sink.of_type(OutcomeEvent)[0].content == run.content
    assert [e.stage for e in sink.of_type(ProgressEvent) if e.status == "FINISHED"] == [
        "ROUTING",
        "MODEL_STEP",
        "MODEL_STEP",
        "EVIDENCE_GUARD",
        "SEMANTIC_GUARD",
        "RELEASE",
    ]
    assert [e.status for e in sink.of_type(ToolEvent)] == ["RUNNING", "SUCCEEDED"]
    steps = list(AgentStep.objects.filter(run_id=run.run_id).order_by("step_index"))
    assert [s.model for s in steps] == ["demo-agent", "demo-agent"]
    assert all(s.reasoning_available and s.usage_available for s in steps)
    assert (
        AgentReasoningAudit.objects.filter(
            run_id=run.run_id, agent_name="diagnosis_agent", reasoning_available=True
        ).count()
        == 2
    )
    attempt = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.ROUTING_ATTEMPT)
    assert attempt.details["model"] == "demo-router"
    semantic = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.SEMANTIC_GUARD_DECISION)
    assert semantic.status == "PASS" and semantic.details["model"] == "demo-guard"
    tool = ToolInvocation.objects.get(run_id=run.run_id)
    assert tool.tool_name == "lookup_knowledge" and tool.retrieval_layer and tool.l0_match_count >= 1
    assert run.tokens_reconciled and run.tokens_router and run.tokens_agent and run.tokens_guard
    assert get_trace(run=run).summary.audit_complete

    # A Chinese runbook question.
    run, outcome, _ = ask(user, DEMO_QUESTIONS[1])
    assert (
        run.release_decision == ReleaseDecision.PUBLISHED
        and "[kb:redis-connection-timeout-zh#" in run.content
    )

    # Small talk: no tools, no evidence needed.
    run, outcome, sink = ask(user, DEMO_QUESTIONS[2])
    assert run.intent == "CHITCHAT" and run.release_decision == ReleaseDecision.PUBLISHED
    assert not sink.of_type(ToolEvent) and "diagnosis assistant" in run.content

    # Outside the runbooks: searched, answered without a citation, repaired in vain, blocked.
    run, outcome, _ = ask(user, DEMO_QUESTIONS[3])
    assert outcome.status == RunStatus.SUCCESS and run.release_decision == ReleaseDecision.BLOCKED
    assert run.content == BLOCKED_MESSAGE
    guards = TraceEvent.objects.filter(run_id=run.run_id, event_type__startswith="EVIDENCE_GUARD")
    assert [(g.event_type, g.status) for g in guards.order_by("sequence_no")] == [
        ("EVIDENCE_GUARD_INITIAL", "FAIL"),
        ("EVIDENCE_GUARD_RETRY", "FAIL"),
    ]

    # Out of scope.
    run, outcome, _ = ask(user, "Tell me a joke about cats")
    assert run.intent == "OUT_OF_SCOPE" and run.release_decision == ReleaseDecision.PUBLISHED


@pytest.mark.asyncio
async def test_demo_client_streams_through_on_text():
    pieces = []

    async def on_text(text):
        pieces.append(text)

    client = DemoModelClient(delta_delay=0)
    result = await client.complete(
        model=client.roles.agent,
        messages=[{"role": "system", "content": "x\nIntent: CHITCHAT"}, {"role": "user", "content": "hi"}],
        on_text=on_text,
    )
    assert len(pieces) > 3 and "".join(pieces) == result.text
    assert (
        result.usage.available
        and result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens
    )
    assert result.reasoning and result.finish_reason == "stop" and result.model == "demo-agent"
