"""Online evaluation scores in the console (`evaluations`): the run list's score column (sortable by
the run's mean score), the run page's table of scores, and the dashboard's trend per evaluator version
(a line per evaluator, mean score per day) and per configuration fingerprint."""

from __future__ import annotations

import datetime as dt

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from evaluations import selectors
from surfaces.admin import configs
from surfaces.admin.charts import empty_chart, lines
from surfaces.admin.display import column

SCORE_EXPLAINED = "mean of the run's online evaluation scores, 0 to 1 (⚑: a score needs a human)"
PALETTE = ("#1565c0", "#6a1b9a", "#00838f", "#ef6c00", "#558b2f", "#ad1457", "#4e342e", "#37474f")


class EvaluationColumn:
    """Mixed into the run list: `evaluation_score`, the mean of the run's scores (sortable), red with
    a flag when a score needs a human (judge `unsupported`, a forbidden command)."""

    @admin.display(
        description=column("eval score", SCORE_EXPLAINED),
        ordering="evaluation_mean",
    )
    def evaluation_score(self, run):
        mean = getattr(run, "evaluation_mean", None)
        flagged = getattr(run, "evaluation_flagged", None) or 0
        if mean is None and not flagged:
            return format_html('<span class="dc-quiet">{}</span>', "—")
        text = "—" if mean is None else f"{mean:.2f}"
        if flagged:
            return format_html(
                '<span class="dc-bad" title="{} score(s) need a human">{} ⚑</span>', flagged, text
            )
        return format_html('<span title="mean of the run\'s evaluation scores">{}</span>', text)


def annotate(queryset):
    return selectors.annotate_mean(queryset)


def run_page_context(run) -> dict:
    """The run page's scores (one query): each with its evaluator version, kind, value, label,
    explanation, judge model, usage and cost, and the sequence number of its chained event."""
    return {"evaluation_scores": selectors.scores_of_run(run_id=run.run_id)}


def dashboard_context(*, since: dt.datetime, until: dt.datetime) -> dict:
    points = selectors.trend(since=since, until=until)
    days = sorted({p.day for p in points})
    names = sorted({p.evaluator for p in points})
    index = {d: i for i, d in enumerate(days)}
    values = {n: [None] * len(days) for n in names}
    for p in points:
        values[p.evaluator][index[p.day]] = p.mean
    chart = (
        lines(
            [d.isoformat() for d in days],
            [(n, values[n], PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)],
            title="Mean evaluation score per day by evaluator",
        )
        if days
        else empty_chart("No evaluation score in this period.")
    )
    runs_url = reverse("admin:diagnosis_diagnosisrun_changelist")
    rows = [
        {
            "row": row,
            "mean": "—" if row.mean is None else f"{row.mean:.2f}",
            "runs_url": runs_url + "?" + urlencode({configs.PARAMETER: row.fingerprint})
            if row.fingerprint
            else "",
        }
        for row in selectors.by_fingerprint(since=since, until=until)
    ]
    return {
        "evaluation_chart": chart,
        "evaluation_days": [(d, [values[n][index[d]] for n in names]) for d in days],
        "evaluation_names": names,
        "evaluation_fingerprints": rows,
    }
