"""Online evaluators on runs the real runtime executed against the local OpenAI-compatible server: each
score is chained as `EVALUATION_RECORDED` with its row bound, anchored by the next checkpoint and
verified; a score edited in SQL is named by `verify_audit`; the LLM judge's own call goes through the
`openai` SDK, is priced and recorded (usage, cost, reasoning row in the governed store)."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from audit.models import EventType, TailPending, TraceEvent
from audit.read import get_trace
from audit.transparency import keys
from audit.verify.runs import verify_run
from diagnosis.models import RunStatus
from evaluations.models import EvaluationScore, Evaluator, EvaluatorKind
from evaluations.services import evaluate_run
from pricing.models import PriceOverride
from reasoning.models import AgentReasoningAudit
from tests.agent.runtime.support import ask, script_reasoned_diagnosis
from tests.fakes.openai_server import stream_answer, usage

JUDGE = "fake-judge"
JUDGE_THINKING = "The du command is in the cited chunk; nothing else is claimed."


@pytest.fixture
def signing_key(settings):
    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    settings.AUDIT_VERIFY_KEYS = []


def _verify_audit(*args: str) -> str:
    out = io.StringIO()
    call_command("verify_audit", *args, stdout=out)
    return out.getvalue()


def _evaluators() -> list[Evaluator]:
    return [
        Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE, min_coverage=0.5),
        Evaluator.objects.create(name="no-destructive-commands", kind=EvaluatorKind.FORBIDDEN_COMMANDS),
        Evaluator.objects.create(name="groundedness", kind=EvaluatorKind.LLM_JUDGE, judge_model=JUDGE),
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus", "signing_key")
def test_scores_are_chained_anchored_verified_and_an_edited_score_is_named(llm, user):
    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    assert run.status == RunStatus.SUCCESS
    call_command("audit_checkpoint", stdout=io.StringIO())
    PriceOverride.objects.create(
        model_pattern=JUDGE,
        provider="openai",
        input_per_mtok=Decimal("2"),
        cached_input_per_mtok=Decimal("1"),
        output_per_mtok=Decimal("8"),
        effective_from=timezone.now() - dt.timedelta(days=1),
    )
    verdict = {"score": 1.0, "label": "supported", "explanation": "The du command is in the chunk."}
    llm.add(JUDGE, stream_answer(json.dumps(verdict), reasoning=JUDGE_THINKING, usage=usage(500, 40)))
    _evaluators()

    scores = evaluate_run(run_id=run.run_id)
    by_name = {s.evaluator_name: s for s in scores}
    # Each score names the configuration that produced the answer (issue 34 item 1's fingerprint).
    run.refresh_from_db()
    assert run.config_fingerprint and all(s.fingerprint == run.config_fingerprint for s in scores)
    assert set(by_name) == {"citations", "no-destructive-commands", "groundedness"}
    assert (by_name["citations"].label, by_name["citations"].value) == ("covered", 1.0)
    assert (by_name["no-destructive-commands"].label, by_name["no-destructive-commands"].value) == (
        "clean",
        1.0,
    )

    # The judge's call went through the openai SDK to the fake server, with the run's question,
    # answer and the cited chunk's text, and was priced by the override: 500 in at $2/Mtok, 40 out at $8.
    (request,) = llm.requests[JUDGE]
    prompt = request.messages[-1]["content"]
    assert "Disk full on /var/log" in prompt and "du" in prompt and "kb:disk-full#" in prompt
    judged = by_name["groundedness"]
    assert (judged.label, judged.value, judged.judge_model) == ("supported", 1.0, JUDGE)
    assert (judged.judge_input_tokens, judged.judge_output_tokens) == (500, 40)
    assert judged.judge_cost_usd == Decimal("0.00132") and judged.judge_cost_status == "priced"

    # Chained after the run's finish, one event per score, with the evaluator's name and version.
    events = list(
        TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.EVALUATION_RECORDED).order_by(
            "sequence_no"
        )
    )
    assert [e.details["scoreId"] for e in events] == [s.score_id for s in scores]
    assert all(e.details["evaluatorVersion"] == 1 and "scoreDigest" in e.details for e in events)
    (judge_event,) = [e for e in events if e.details["scoreId"] == judged.score_id]
    assert judge_event.details["judgeModel"] == JUDGE
    assert judge_event.details["judgeUsage"]["promptTokens"] == 500
    assert judge_event.details["judgeCostUsd"] == "0.0013200000"
    assert "The du command is in the chunk" not in json.dumps(judge_event.details)  # bounded facts only
    # The judge's reasoning is in the governed store, bound by the same event.
    row = AgentReasoningAudit.objects.get(run_id=run.run_id, agent_name="judge")
    assert row.step_index == judge_event.sequence_no and row.reasoning_content == JUDGE_THINKING
    assert judge_event.details["reasoningDigest"] and judge_event.details["agentName"] == "judge"
    assert TailPending.objects.get(run_id=run.run_id).last_sequence_no == events[-1].sequence_no

    # Anchored by the next checkpoint; everything verifies, the score rows among the verified rows.
    call_command("audit_checkpoint", stdout=io.StringIO())
    try:
        _verify_audit()
    except CommandError:
        print(verify_run(run.run_id))
        raise
    before = verify_run(run.run_id)
    assert before.ok, before.invalid
    trace = get_trace(run=run)
    assert trace.summary.chain_valid

    # A second pass scores nothing again (one score per run and evaluator version).
    assert evaluate_run(run_id=run.run_id) == []

    # A database writer turns the unsupported into supported: the score row no longer matches.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE evaluations_score SET value = 0.25 WHERE score_id = %s", [by_name["citations"].score_id]
        )
    result = verify_run(run.run_id)
    assert any(
        f"evaluation score {by_name['citations'].score_id}: stored row does not match" in p
        for p in result.invalid
    ), result.invalid
    with pytest.raises(CommandError):
        _verify_audit()

    # A deleted score is missing, an inserted one unrecorded.
    EvaluationScore.objects.filter(score_id=by_name["citations"].score_id).delete()
    result = verify_run(run.run_id)
    assert any("missing" in p and by_name["citations"].score_id in p for p in result.invalid), result.invalid


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus", "signing_key")
def test_the_retention_purge_deletes_a_runs_scores_with_its_record(llm, user, settings):
    from audit.models import RunTombstone
    from audit.write.retention import purge_expired_runs

    settings.AUDIT_WITNESS_PATH = ""
    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    citations = Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE)
    evaluate_run(run_id=run.run_id, evaluators=[citations])
    call_command("audit_checkpoint", stdout=io.StringIO())
    settings.AUDIT_RETENTION_DAYS = 0
    report = purge_expired_runs(now=timezone.now() + dt.timedelta(seconds=1), retention_days=0)
    assert run.run_id in report.purged
    assert not EvaluationScore.objects.filter(run_id=run.run_id).exists()
    assert RunTombstone.objects.get(run_id=run.run_id).rows_deleted["evaluation_scores"] == 1
    call_command("audit_checkpoint", stdout=io.StringIO())
    _verify_audit()
