"""The "Unanswered questions" page (`/admin/diagnosis/diagnosisrun/gaps/`): for a period (the dashboard's
picker), the groups of redacted questions of the runs that were blocked, out of scope, voted down or
scored low (`evaluations.gaps.find_gaps`), each named by its terms, counted, its runs linked, and the
closest runbook. GET only; staff who may view runs. Details: docs/admin.md, *Unanswered questions*.
"""

from __future__ import annotations

import datetime as dt

from django.template.response import TemplateResponse
from django.urls import reverse

from evaluations import gaps
from surfaces.admin.dashboard import PRESETS, period_of


def _below(request) -> tuple[float, str]:
    raw = request.GET.get("below") or ""
    if not raw:
        return gaps.DEFAULT_BELOW, ""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        return (
            gaps.DEFAULT_BELOW,
            f"A low score is a number from 0 to 1; showing below {gaps.DEFAULT_BELOW:g}.",
        )
    return value, ""


def gaps_view(model_admin, request):
    since, until, period_error = period_of(request)
    below, below_error = _below(request)
    start = dt.datetime.combine(since, dt.time(), tzinfo=dt.UTC)
    end = dt.datetime.combine(until + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
    report = gaps.find_gaps(since=start, until=end, below=below)
    rows = [
        {
            "gap": gap,
            "reasons": [(gaps.REASON_LABELS[k], n) for k, n in sorted(gap.reasons.items())],
            "links": [
                (run.run_id, reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk]))
                for run in gap.run_links
            ],
            "more": gap.runs - len(gap.run_links),
            "runbook_url": reverse("knowledge-document", args=[gap.closest.slug])
            + f"?chunk={gap.closest.evidence_id.rsplit('#', 1)[1]}"
            if gap.closest
            else "",
        }
        for gap in report.gaps
    ]
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Unanswered questions",
        "since": since,
        "until": until,
        "period_error": period_error,
        "below": below,
        "below_error": below_error,
        "presets": PRESETS,
        "report": report,
        "rows": rows,
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/diagnosis/diagnosisrun/gaps.html", context)
