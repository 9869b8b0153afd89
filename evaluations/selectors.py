"""Reads of the scores for the console: a run's scores (the run page), the list's per-run mean (an
annotation, `annotate_mean`), the trend per evaluator version by day and by configuration
fingerprint (the dashboard), and how many runs wait for an evaluator (`waiting`, its admin list)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Avg, Count, FloatField, OuterRef, QuerySet, Subquery
from django.db.models.functions import TruncDate

from diagnosis.models import DiagnosisRun
from diagnosis.selectors import PRODUCTION
from evaluations.models import NEEDS_HUMAN_LABELS, EvaluationScore, Evaluator
from evaluations.scorers import sampled


def production_scores() -> QuerySet:
    """Scores of production runs: an experiment's replays (`diagnosis.selectors.PRODUCTION`) are no part
    of the trend, the fingerprint table or /metrics (their results page compares them)."""
    experiments = DiagnosisRun.objects.exclude(PRODUCTION).values("run_id")
    return EvaluationScore.objects.exclude(run_id__in=experiments)


def scores_of_run(*, run_id: str) -> list[EvaluationScore]:
    """The run's scores in chain order (one query on the (run, evaluator) index)."""
    return list(EvaluationScore.objects.filter(run_id=run_id).order_by("sequence_no"))


def annotate_mean(runs: QuerySet) -> QuerySet:
    """Each run with `evaluation_mean` (mean of its valued scores, None without one) and
    `evaluation_count`: correlated subqueries on the (run, evaluator) index, evaluated for the rows a
    page returns (sorting by them reads every run's scores)."""
    scores = EvaluationScore.objects.filter(run_id=OuterRef("run_id")).order_by().values("run_id")
    return runs.annotate(
        evaluation_mean=Subquery(scores.annotate(m=Avg("value")).values("m")[:1], output_field=FloatField()),
        evaluation_flagged=Subquery(
            scores.filter(label__in=NEEDS_HUMAN_LABELS).annotate(n=Count("id")).values("n")[:1]
        ),
    )


@dataclass(frozen=True, slots=True)
class TrendPoint:
    day: dt.date
    evaluator: str  # "name v<version>"
    mean: float | None
    scores: int


@dataclass(frozen=True, slots=True)
class FingerprintRow:
    evaluator: str
    fingerprint: str
    mean: float | None
    scores: int
    flagged: int


def trend(*, since: dt.datetime, until: dt.datetime) -> list[TrendPoint]:
    """Mean score per day (of scoring) and evaluator version, over [since, until) (one query)."""
    rows = (
        production_scores()
        .filter(created_at__gte=since, created_at__lt=until)
        .annotate(day=TruncDate("created_at"))
        .values("day", "evaluator_name", "evaluator_version")
        .annotate(mean=Avg("value"), n=Count("id"))
        .order_by("day", "evaluator_name", "evaluator_version")
    )
    return [
        TrendPoint(r["day"], f"{r['evaluator_name']} v{r['evaluator_version']}", r["mean"], r["n"])
        for r in rows
    ]


def by_fingerprint(*, since: dt.datetime, until: dt.datetime) -> list[FingerprintRow]:
    """Mean score per evaluator version and configuration fingerprint over [since, until) (one query)."""
    rows = (
        production_scores()
        .filter(created_at__gte=since, created_at__lt=until)
        .values("evaluator_name", "evaluator_version", "fingerprint")
        .annotate(mean=Avg("value"), n=Count("id"))
        .order_by("evaluator_name", "evaluator_version", "fingerprint")
    )
    flagged = {
        (r["evaluator_name"], r["evaluator_version"], r["fingerprint"]): r["n"]
        for r in production_scores()
        .filter(created_at__gte=since, created_at__lt=until, label__in=NEEDS_HUMAN_LABELS)
        .values("evaluator_name", "evaluator_version", "fingerprint")
        .annotate(n=Count("id"))
        .order_by()
    }
    return [
        FingerprintRow(
            f"{r['evaluator_name']} v{r['evaluator_version']}",
            r["fingerprint"],
            r["mean"],
            r["n"],
            flagged.get((r["evaluator_name"], r["evaluator_version"], r["fingerprint"]), 0),
        )
        for r in rows
    ]


def waiting(*, evaluator: Evaluator) -> int:
    """Runs waiting for `evaluator`: finished in the look-back window, taken by its filter and its
    sample, not scored yet (what the next passes of the duty will score); 0 when it is disabled."""
    from evaluations.services import unscored

    if not evaluator.enabled:
        return 0
    runs = unscored(evaluator=evaluator)
    if float(evaluator.sample_rate) >= 1.0:
        return runs.count()
    ids = runs.values_list("run_id", flat=True).iterator(chunk_size=2000)
    return sum(1 for run_id in ids if sampled(evaluator=evaluator, run_id=run_id))
