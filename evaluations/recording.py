"""A score into the run's record: `record_score` inserts the score row and appends `EVALUATION_RECORDED`
to the finished run's chain in one transaction through `audit.write.append_to_finished_run`
(fail-closed: no score without its event, no event without its row).

The event carries bounded facts and `scoreDigest` (never the explanation's text); a judge's reasoning
and reply go to the governed reasoning store, bound by the same event. `register()` (at app start) gives
the row its digest form and its source for the verifier, so `verify_audit` recomputes every score.
Details: docs/evaluations.md, *In the record*.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.models import EventType, Phase
from audit.payloads import canonical_json, sha256_hex
from audit.verify import appended_rows, coverage, row_digests
from audit.write import ChainEvent, Tail, append_to_finished_run, row_insert
from core.compiled import RowsOfRun
from diagnosis.services import new_id
from evaluations.models import EvaluationClaim, EvaluationScore, Evaluator
from reasoning.capture import CapturedReasoning
from reasoning.models import AgentReasoningAudit

logger = logging.getLogger("evaluations.recording")

JUDGE_AGENT = "judge"
COST_PLACES = Decimal("0.0000000001")  # the column's 10 decimal places: the digest sees what is stored

SCORE_COLUMNS = (
    "score_id",
    "run_id",
    "session_id",
    "evaluator_id",
    "evaluator_name",
    "evaluator_version",
    "kind",
    "value",
    "label",
    "explanation",
    "fingerprint",
    "judge_model",
    "judge_input_tokens",
    "judge_output_tokens",
    "judge_reasoning_tokens",
    "judge_cost_usd",
    "judge_cost_status",
    "judge_duration_ms",
    "sequence_no",
    "created_at",
)
SCORE_FORM = row_digests.Form("evaluation-score", EvaluationScore, SCORE_COLUMNS)


@dataclass(frozen=True, slots=True)
class JudgeCall:
    """The judge's model call as it happened: model, usage (`audit.write.runtime_facts.Usage`), attempts,
    duration, price, and its reasoning capture (None: nothing to store)."""

    model: str
    provider: str
    usage: Any
    attempts: Sequence[dict[str, Any]]
    duration_ms: int
    cost: Decimal | None
    cost_status: str
    reasoning: CapturedReasoning | None
    error_code: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an evaluator concluded (`evaluations.scorers`)."""

    value: float | None
    label: str
    explanation: str


def config_digest(evaluator: Evaluator) -> str:
    """sha256 of the evaluator version's configuration (every field that decides a score, canonical
    JSON): chained with each score, so a configuration changed after the fact is provable."""

    fields = [
        f.name
        for f in Evaluator._meta.concrete_fields
        if f.name not in ("id", "enabled", "created_at", "description")
    ]
    return sha256_hex(canonical_json({name: str(getattr(evaluator, name)) for name in fields}))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def record_score(
    *, run: Any, evaluator: Evaluator, outcome: Outcome, fingerprint: str = "", judge: JudgeCall | None = None
) -> EvaluationScore:
    """Insert `evaluator`'s score of the finished `run` and chain it (see the module docstring).
    IntegrityError when the run already has a score of this evaluator version (nothing written);
    `audit.write.RunNotFinished` for a run that is not terminal."""
    score: EvaluationScore | None = None
    cost = judge.cost.quantize(COST_PLACES) if judge is not None and judge.cost is not None else None

    def compose(tail: Tail):
        nonlocal score
        now = timezone.now()
        score = _score_row(tail, evaluator, outcome, fingerprint, judge, cost, now)
        row = row_insert(score)
        details: dict[str, Any] = {
            "scoreId": score.score_id,
            "evaluator": evaluator.name,
            "evaluatorVersion": evaluator.version,
            "evaluatorId": evaluator.pk,
            "evaluatorConfigSha256": config_digest(evaluator),
            "kind": evaluator.kind,
            "value": score.value,
            "label": score.label,
            "explanationChars": len(outcome.explanation),
            "explanationSha256": sha256_hex(outcome.explanation),
            "fingerprint": score.fingerprint,
        }
        bind: dict[str, Any] = {"scoreDigest": row}
        rows = [row]
        if judge is not None:
            rows += _judge_facts(tail, judge, cost, now, details, bind)
        event = ChainEvent(
            Phase.RUN,
            EventType.EVALUATION_RECORDED,
            score.label.upper(),
            f"{evaluator.label}: {score.label}" + ("" if score.value is None else f" ({score.value:g})"),
            details,
            bind=bind,
        )
        return [event], rows

    with transaction.atomic():
        append_to_finished_run(run_id=run.run_id, compose=compose)
        if score.needs_human:
            from evaluations.queue import refresh

            refresh(run.run_id)
    logger.info(
        "evaluation recorded run=%s evaluator=%s v%s label=%s",
        run.run_id,
        evaluator.name,
        evaluator.version,
        score.label,
    )
    return EvaluationScore.objects.get(score_id=score.score_id)


def _score_row(
    tail: Tail,
    evaluator: Evaluator,
    outcome: Outcome,
    fingerprint: str,
    judge: JudgeCall | None,
    cost: Decimal | None,
    now: Any,
) -> EvaluationScore:
    """The score row as appended at the run's chain head (`tail`), with the judge's call when one ran."""
    usage = judge.usage if judge is not None else None
    return EvaluationScore(
        score_id=new_id("score"),
        run_id=tail.run_id,
        session_id=tail.session_id,
        evaluator=evaluator,
        evaluator_name=evaluator.name,
        evaluator_version=evaluator.version,
        kind=evaluator.kind,
        value=_rounded(outcome.value),
        label=outcome.label[:32],
        explanation=outcome.explanation,
        fingerprint=fingerprint or "",
        judge_model=judge.model if judge is not None else "",
        judge_input_tokens=getattr(usage, "prompt_tokens", None),
        judge_output_tokens=getattr(usage, "completion_tokens", None),
        judge_reasoning_tokens=getattr(usage, "reasoning_tokens", None),
        judge_cost_usd=cost,
        judge_cost_status=judge.cost_status if judge is not None else "",
        judge_duration_ms=judge.duration_ms if judge is not None else None,
        sequence_no=tail.next_sequence,
        created_at=now,
    )


def _judge_facts(
    tail: Tail,
    judge: JudgeCall,
    cost: Decimal | None,
    now: Any,
    details: dict[str, Any],
    bind: dict[str, Any],
) -> list[Any]:
    """What the event says about the judge's call (added to `details`): its model, usage, attempts,
    duration, cost and error; with its reasoning, the reasoning row (bound in `bind`), which is returned
    to be appended with the score."""
    usage = judge.usage
    details.update(
        {
            "judgeModel": judge.model,
            "judgeProvider": judge.provider,
            "judgeUsage": usage.as_details() if usage is not None else {"usageAvailable": False},
            "judgeAttempts": list(judge.attempts),
            "judgeDurationMs": judge.duration_ms,
            "judgeCostUsd": str(cost) if cost is not None else None,
            "judgeCostStatus": judge.cost_status,
        }
    )
    if judge.error_code:
        details["judgeError"] = judge.error_code
    if judge.reasoning is None:
        return []
    reasoning = judge.reasoning
    reasoning_row = row_insert(
        AgentReasoningAudit(
            session_id=tail.session_id,
            run_id=tail.run_id,
            step_index=tail.next_sequence,
            agent_name=JUDGE_AGENT,
            reasoning_available=reasoning.reasoning_available,
            reasoning_content=reasoning.reasoning_content,
            assistant_text=reasoning.assistant_text,
            content_source=reasoning.content_source,
            content_bytes=reasoning.content_bytes,
            created_at=now,
        )
    )
    bind["reasoningDigest"] = reasoning_row
    details.update(
        {
            "reasoningStepIndex": tail.next_sequence,
            "agentName": JUDGE_AGENT,
            "reasoningAvailable": reasoning.reasoning_available,
            "reasoningBytes": reasoning.reasoning_bytes,
            "assistantBytes": reasoning.assistant_bytes,
            "contentSource": reasoning.content_source,
        }
    )
    return [reasoning_row]


# --------------------------------------------------------------------------------------------------
# The verifier's view of the rows
# --------------------------------------------------------------------------------------------------
# One run's scores (every trace read asks): the query compiled once, rows without model instances.
_SCORES_OF_RUN = RowsOfRun(EvaluationScore, ("sequence_no",))


def _rows_of(run_ids: Sequence[str]) -> list[tuple[str, str, str]]:
    if len(run_ids) == 1:
        scores = _SCORES_OF_RUN(run_ids[0])
        return [(score.run_id, score.score_id, SCORE_FORM.digest_of(score)) for score in scores]
    return [
        (score.run_id, score.score_id, SCORE_FORM.digest_of(score))
        for score in EvaluationScore.objects.filter(run_id__in=run_ids).order_by("run_id", "sequence_no")
    ]


def _orphans() -> set[str]:
    from diagnosis.models import DiagnosisRun

    known = DiagnosisRun.objects.values("run_id")
    return set(EvaluationScore.objects.exclude(run_id__in=known).values_list("run_id", flat=True).distinct())


def register() -> None:
    row_digests.register_form(SCORE_FORM)
    coverage.register(
        EvaluationScore,
        covered=coverage._by_forms(SCORE_FORM),
        excluded={"id": coverage.SURROGATE},
        rows="bound by its EVALUATION_RECORDED: missing, or stored without a record in the chain",
        not_audited={
            Evaluator: (
                "an evaluator's configuration, frozen in the admin once it scored; each score chains its "
                "name, version and the sha256 of its configuration (evaluatorConfigSha256)"
            ),
            EvaluationClaim: "a worker's claim while it scores a run: operational, evidence of nothing",
        },
    )
    appended_rows.register(
        appended_rows.RowSource(
            EventType.EVALUATION_RECORDED,
            "evaluation score",
            _rows_of,
            run_ids=_orphans,
            model=EvaluationScore,
            purge_name="evaluation_scores",
        )
    )
