"""Evaluation scores on /metrics (`telemetry.metrics.register_record_source`): read with the record
metrics, in one query over the same sliding window, and cached with them; experiment replays' scores
are left out. Series: `diagnosis_evaluation_score_mean`, `diagnosis_evaluation_scores` (by label) and
`diagnosis_evaluation_judge_cost_dollars`, labelled by evaluator, version and configuration fingerprint
(or judge model). The shipped alerting rules alert on a low or dropping mean.
Details: docs/evaluations.md, *Where scores show* (Prometheus) and *Alerting rules*.
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Avg, Count, Sum
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from telemetry.metrics import register_record_source, window_seconds


def evaluation_metrics() -> list[Metric]:
    from evaluations.selectors import production_scores

    since = timezone.now() - dt.timedelta(seconds=window_seconds())
    recent = production_scores().filter(created_at__gte=since)
    mean = GaugeMetricFamily(
        "diagnosis_evaluation_score_mean",
        "Mean evaluation score (0..1) of the window's scores, by evaluator, version and configuration "
        "fingerprint.",
        labels=["evaluator", "version", "fingerprint"],
    )
    counts = GaugeMetricFamily(
        "diagnosis_evaluation_scores",
        "Evaluation scores recorded in the window, by evaluator, version, fingerprint and label.",
        labels=["evaluator", "version", "fingerprint", "label"],
    )
    cost = GaugeMetricFamily(
        "diagnosis_evaluation_judge_cost_dollars",
        "What the window's LLM-judge calls cost (priced calls only), by evaluator, version and model.",
        labels=["evaluator", "version", "model"],
    )
    rows = (
        recent.values("evaluator_name", "evaluator_version", "fingerprint", "label", "judge_model")
        .annotate(n=Count("id"), mean=Avg("value"), valued=Count("value"), cost=Sum("judge_cost_usd"))
        .order_by()
    )
    sums: dict[tuple[str, str, str], list[float]] = {}
    costs: dict[tuple[str, str, str], float] = {}
    for row in rows:
        version = str(row["evaluator_version"])
        key = (row["evaluator_name"], version, row["fingerprint"] or "")
        counts.add_metric([*key, row["label"]], row["n"])
        if row["valued"]:
            acc = sums.setdefault(key, [0.0, 0])
            acc[0] += float(row["mean"]) * row["valued"]
            acc[1] += row["valued"]
        if row["judge_model"]:
            ckey = (row["evaluator_name"], version, row["judge_model"])
            costs[ckey] = costs.get(ckey, 0.0) + float(row["cost"] or 0)
    for key, (total, n) in sorted(sums.items()):
        mean.add_metric(list(key), total / n)
    for key, value in sorted(costs.items()):
        cost.add_metric(list(key), value)
    return [mean, counts, cost]


def register() -> None:
    register_record_source(evaluation_metrics)
