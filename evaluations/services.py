"""Scoring finished runs: `evaluate_run` (one run, now) and `score_pending` (the worker's pass).

Each score is claimed first (`EvaluationClaim`: two workers never make the same judge call), computed
(a deterministic scorer or the judge's call), recorded and chained in one transaction
(`evaluations.recording.record_score`), then exported to OpenTelemetry, best effort. `score_pending` is
one pass over the recent finished runs some enabled evaluator has not scored: the background duty of
every serving process (`evaluations.duty`) and `manage.py run_evaluations` run it. Nothing here runs on
a run's path.
Details: docs/evaluations.md, *The worker*.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from audit.write import RunNotFinished
from diagnosis.models import DiagnosisRun
from diagnosis.selectors import production
from evaluations import otel
from evaluations.judge import judge
from evaluations.models import EvaluationClaim, EvaluationScore, Evaluator, EvaluatorKind
from evaluations.recording import JudgeCall, Outcome, record_score
from evaluations.scorers import DETERMINISTIC, TERMINAL, applies

logger = logging.getLogger("evaluations")

RETRY_OWNER = "(retry after a failed judge call)"  # no process's owner: only a stale claim is taken over


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def claim_seconds() -> float:
    return float(settings.EVALUATION_CLAIM_SECONDS)


def claim(*, run_id: str, evaluator: Evaluator, owner: str | None = None) -> bool:
    """Claim scoring `run_id` with `evaluator` for this process: true when the claim is ours (inserted
    now, or taken over from a claim older than `EVALUATION_CLAIM_SECONDS`), false when another worker
    holds it or the score exists."""
    owner = owner or _owner()
    now = timezone.now()
    if EvaluationScore.objects.filter(run_id=run_id, evaluator=evaluator).exists():
        return False
    try:
        with transaction.atomic():
            EvaluationClaim.objects.create(run_id=run_id, evaluator=evaluator, owner=owner, claimed_at=now)
        return True
    except IntegrityError:
        stale = now - dt.timedelta(seconds=claim_seconds())
        taken = (
            EvaluationClaim.objects.filter(run_id=run_id, evaluator=evaluator)
            .filter(Q(claimed_at__lt=stale) | Q(owner=owner))
            .update(owner=owner, claimed_at=now)
        )
        return bool(taken)


def judge_attempts() -> int:
    """A judge call that failed (provider down, rate limited) is retried by a later pass, after the claim
    has gone stale; the last attempt's failure is recorded as a `judge_error` score (so it is visible,
    priced where usage was reported, and the run is not retried for ever)."""
    return max(1, int(settings.EVALUATION_JUDGE_ATTEMPTS))


def _retry_later(run_id: str, evaluator: Evaluator) -> bool:
    """After a failed judge call: keep the claim (stale after `EVALUATION_CLAIM_SECONDS`, then retried)
    and count the attempt; false when this was the last attempt (the failure is then recorded)."""
    claim_row = EvaluationClaim.objects.filter(run_id=run_id, evaluator=evaluator).first()
    if claim_row is None or claim_row.attempts >= judge_attempts():
        return False
    EvaluationClaim.objects.filter(pk=claim_row.pk).update(
        attempts=claim_row.attempts + 1, claimed_at=timezone.now(), owner=RETRY_OWNER
    )
    return True


def release(*, run_id: str, evaluator: Evaluator) -> None:
    EvaluationClaim.objects.filter(run_id=run_id, evaluator=evaluator).delete()


def outcome_of(evaluator: Evaluator, run: DiagnosisRun) -> tuple[Outcome, JudgeCall | None]:
    """The evaluator's score of `run` (the judge's call included for an LLM judge)."""
    if evaluator.kind == EvaluatorKind.LLM_JUDGE:
        return judge(evaluator, run)
    return DETERMINISTIC[evaluator.kind](evaluator, run), None


@dataclass(slots=True)
class Pass:
    """What one pass did: scores recorded, pairs skipped (claimed elsewhere), errors."""

    scores: list[EvaluationScore] = field(default_factory=list)
    skipped: int = 0
    errors: int = 0


def _score_one(run: DiagnosisRun, evaluator: Evaluator, result: Pass, *, retry: bool = False) -> None:
    """Claim, score, record and export one pair. `retry` (the worker's passes): a failed judge call
    leaves the claim to go stale and is tried again by a later pass, up to `EVALUATION_JUDGE_ATTEMPTS`;
    without it (an explicit `evaluate_run`) the failure is recorded at once."""
    if not claim(run_id=run.run_id, evaluator=evaluator):
        result.skipped += 1
        return
    keep_claim = False
    try:
        outcome, call = outcome_of(evaluator, run)
        if retry and call is not None and call.error_code and _retry_later(run.run_id, evaluator):
            keep_claim = True
            result.errors += 1
            logger.info("judge call failed, retried later run=%s evaluator=%s", run.run_id, evaluator.label)
            return
        score = record_score(
            run=run,
            evaluator=evaluator,
            outcome=outcome,
            fingerprint=str(getattr(run, "config_fingerprint", "") or ""),
            judge=call,
        )
    except IntegrityError:  # scored meanwhile by a worker whose claim we took over as stale
        result.skipped += 1
        return
    except RunNotFinished:
        result.skipped += 1
        return
    except Exception as exc:
        result.errors += 1
        logger.warning(
            "evaluation failed run=%s evaluator=%s error=%s", run.run_id, evaluator.label, type(exc).__name__
        )
        return
    finally:
        if not keep_claim:
            release(run_id=run.run_id, evaluator=evaluator)
    result.scores.append(score)
    otel.export_scores(run=run, scores=[score])


def evaluate_run(*, run_id: str, evaluators: Iterable[Evaluator] | None = None) -> list[EvaluationScore]:
    """Score the finished run `run_id` (see the module docstring); returns the scores recorded now.
    `evaluators` given: exactly those (still only enabled ones whose filter takes the run; the sample
    is not applied to an explicit list), else every applicable one. DiagnosisRun.DoesNotExist for an
    unknown run; RunNotFinished for a run still executing."""
    run = DiagnosisRun.objects.get(run_id=run_id)
    if run.status not in TERMINAL:
        raise RunNotFinished(f"run {run_id} is {run.status}")
    if evaluators is None:
        chosen = [e for e in Evaluator.objects.filter(enabled=True) if applies(evaluator=e, run=run)]
    else:
        from evaluations.diagnosis import takes
        from evaluations.scorers import matches

        chosen = [
            e for e in evaluators if e.enabled and matches(evaluator=e, run=run) and takes(e, run.run_id)
        ]
    done = set(EvaluationScore.objects.filter(run_id=run_id).values_list("evaluator_id", flat=True))
    result = Pass()
    for evaluator in chosen:
        if evaluator.pk not in done:
            _score_one(run, evaluator, result)
    return result.scores


def lookback_hours() -> float:
    return float(settings.EVALUATION_LOOKBACK_HOURS)


def pending_runs(*, evaluator: Evaluator) -> Iterable[DiagnosisRun]:
    """Finished runs of the look-back window that `evaluator`'s filter takes and it has not scored,
    oldest first (one streamed query; the sample is applied by the caller, so runs outside it are
    read again at the next pass: a hash each, no write)."""
    return unscored(evaluator=evaluator).order_by("finished_at", "id").iterator(chunk_size=500)


def unscored(*, evaluator: Evaluator) -> QuerySet[DiagnosisRun]:
    """The query of `pending_runs`, unordered (the admin counts the runs that wait from it)."""
    from evaluations.diagnosis import KINDS

    if evaluator.kind in KINDS or float(evaluator.sample_rate) <= 0.0:
        # The diagnosis scorers score benchmark replays only; a rate of 0 samples nothing.
        return DiagnosisRun.objects.none()
    since = timezone.now() - dt.timedelta(hours=lookback_hours())
    # Production runs only: an experiment scores its own replays (`experiments.scoring`, evaluate_run).
    runs = production(DiagnosisRun.objects.filter(status__in=TERMINAL, finished_at__gte=since)).exclude(
        Exists(EvaluationScore.objects.filter(run_id=OuterRef("run_id"), evaluator=evaluator))
    )
    for column, wanted in (
        ("agent_flow", evaluator.flow_list()),
        ("intent", evaluator.intent_list()),
        ("release_decision", evaluator.release_list()),
    ):
        if wanted:
            runs = runs.filter(**{f"{column}__in": wanted})
    return runs


def score_pending(*, limit: int = 100) -> Pass:
    """One pass of the worker: for each enabled evaluator, score up to `limit` pending runs."""
    result = Pass()
    for evaluator in Evaluator.objects.filter(enabled=True):
        scored = 0
        for run in pending_runs(evaluator=evaluator):
            if scored >= limit:
                break
            if applies(evaluator=evaluator, run=run):
                _score_one(run, evaluator, result, retry=True)
                scored += 1
    return result
