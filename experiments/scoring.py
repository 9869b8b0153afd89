"""Scoring for experiments: the one place experiments meet the online evaluators (`evaluations`).

`score_runs(run_ids=…)` scores every stored, finished run of `run_ids` with every enabled evaluator
whose filter takes it (`evaluations.services.evaluate_run` with the explicit list, so the sampling rate
that thins production scoring never leaves one side of a comparison unscored), each score chained in
the run's record as EVALUATION_RECORDED; versions that scored a run already are not asked again.
`scores_of(run_ids=…)` reads them back: `{run_id: {evaluator name: (version, value, label)}}`, the
newest version of each evaluator. `expected_of(run_id)`: the benchmark scenario a replay answered (its
item's `expected`), registered with `evaluations.diagnosis` at app start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from audit.write import RunNotFinished
from diagnosis.models import DiagnosisRun
from evaluations.models import EvaluationScore, Evaluator
from evaluations.services import evaluate_run

logger = logging.getLogger(__name__)


def score_runs(*, run_ids: Iterable[str]) -> int:
    """Score the runs (see the module docstring); returns how many scores were recorded now."""
    evaluators = list(Evaluator.objects.filter(enabled=True))
    if not evaluators:
        return 0
    recorded = 0
    for run_id in DiagnosisRun.objects.filter(run_id__in=list(run_ids)).values_list("run_id", flat=True):
        try:
            recorded += len(evaluate_run(run_id=run_id, evaluators=evaluators))
        except RunNotFinished:
            continue
        except Exception as exc:  # a score that cannot be made is missing from the comparison, shown so
            logger.warning("experiment scoring failed run=%s error=%s", run_id, type(exc).__name__)
    return recorded


def expected_of(run_id: str) -> dict | None:
    """The expected findings of the item `run_id` replayed, or None (not a benchmark replay)."""
    from experiments.models import ExperimentRun

    row = ExperimentRun.objects.filter(run_id=run_id).select_related("item").first()
    return (row.item.expected or None) if row is not None else None


def scores_of(*, run_ids: Iterable[str]) -> dict[str, dict[str, tuple[int, float | None, str]]]:
    out: dict[str, dict[str, tuple[int, float | None, str]]] = {}
    rows = EvaluationScore.objects.filter(run_id__in=list(run_ids)).order_by(
        "evaluator_version", "sequence_no"
    )
    for run_id, name, version, value, label in rows.values_list(
        "run_id", "evaluator_name", "evaluator_version", "value", "label"
    ):
        out.setdefault(run_id, {})[name] = (version, value, label)
    return out
