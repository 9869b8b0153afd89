"""The oversight dashboard (`/admin/diagnosis/diagnosisrun/dashboard/`): a period picker and, for the
period, the figures of `audit.read.dashboard` as server-drawn SVG charts (`surfaces.admin.charts`), each with
its numbers as a table. Staff with the run list's view permission see it; it is linked from the index."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_date
from django.utils.http import urlencode

from audit.read.dashboard import get_dashboard
from pricing.rules import format_usd
from surfaces.admin import evaluation_views
from surfaces.admin.charts import empty_chart, stacked_bars

PRESETS = (7, 30, 90)
MAX_DAYS = 366
GOOD, BAD, QUIET, WARN = "#2e7d32", "#c62828", "#9e9e9e", "#ef6c00"
PALETTE = ("#1565c0", "#6a1b9a", "#00838f", "#ef6c00", "#558b2f", "#ad1457", "#4e342e", "#37474f")


def period_of(request) -> tuple[dt.date, dt.date, str]:
    """[since, until] as dates from `?since=&until=` (inclusive until), or `?days=N` back from today;
    the last 7 days by default; and what was wrong with the request, if anything ("" when nothing). A
    range that cannot be shown — a date that is not one, an end before the start, more than `MAX_DAYS`
    days, a `days` that is not 1 … `MAX_DAYS` — is named, and the last 7 days are shown instead, so the
    page never silently shows another period than the one asked for."""
    today = timezone.now().date()
    default = (today - dt.timedelta(days=6), today)
    raw_since, raw_until = request.GET.get("since") or "", request.GET.get("until") or ""
    if raw_since or raw_until:
        try:
            since, until = parse_date(raw_since), parse_date(raw_until)
        except ValueError:
            since = until = None
        if since is None or until is None:
            return *default, "Give both dates of the period as YYYY-MM-DD."
        if until < since:
            return *default, f"The period ends ({until}) before it starts ({since})."
        if (until - since).days + 1 > MAX_DAYS:
            return *default, f"A period is at most {MAX_DAYS} days; this one is {(until - since).days + 1}."
        return since, until, ""
    raw_days = request.GET.get("days") or "7"
    if not raw_days.isdigit() or not 1 <= int(raw_days) <= MAX_DAYS:
        return *default, f"days must be a whole number from 1 to {MAX_DAYS}."
    return today - dt.timedelta(days=int(raw_days) - 1), today, ""


def dashboard_view(model_admin, request):
    since, until, period_error = period_of(request)
    start = dt.datetime.combine(since, dt.time(), tzinfo=dt.UTC)
    end = dt.datetime.combine(until + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
    board = get_dashboard(since=start, until=end)
    readers = board.readers
    read_days = sorted(board.reads)
    totals = board.totals
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Oversight dashboard",
        "since": since,
        "until": until,
        "period_error": period_error,
        "presets": PRESETS,
        "board": board,
        "totals": totals,
        "block_rate": totals.block_rate,
        "total_cost": format_usd(totals.cost),
        "charts": _charts(board),
        "token_rows": [
            {"row": t, "cost": format_usd(t.cost) if t.cost is not None else t.cost_status.replace("_", " ")}
            for t in board.tokens
        ],
        "day_rows": [{"d": d, "cost": format_usd(d.cost)} for d in board.days],
        "readers": readers,
        "links": _run_links(start, end),
        "read_rows": [(d, [board.reads[d].get(r, 0) for r in readers]) for d in read_days],
        **evaluation_views.dashboard_context(since=start, until=end),
        "media": model_admin.media,
        "is_nav_sidebar_enabled": False,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/diagnosis/dashboard.html", context)


def _charts(board) -> dict[str, Any]:
    """The dashboard's charts: runs per day by release, tokens and cost per day by source and model,
    tool calls by tool, reasoning reads per day by reader."""
    labels = [d.day.isoformat() for d in board.days]
    runs_chart = (
        stacked_bars(
            labels,
            [
                ("published", [d.published for d in board.days], GOOD),
                ("blocked", [d.blocked for d in board.days], BAD),
                ("no release", [d.no_release for d in board.days], QUIET),
            ],
            title="Runs per day by release decision",
        )
        if board.days
        else empty_chart("No run in this period.")
    )
    # Tokens and cost per day by source and model: one series per (source, model).
    keys = sorted({(t.source, t.model) for t in board.tokens})
    day_index = {d: i for i, d in enumerate(sorted({t.day for t in board.tokens}))}
    token_labels = [d.isoformat() for d in sorted(day_index)]
    tok = {k: [0] * len(day_index) for k in keys}
    cost = {k: [0.0] * len(day_index) for k in keys}
    for t in board.tokens:
        tok[(t.source, t.model)][day_index[t.day]] += t.total
        if t.cost is not None:
            cost[(t.source, t.model)][day_index[t.day]] += float(t.cost)
    colours = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(keys)}
    tokens_chart = (
        stacked_bars(
            token_labels,
            [(f"{s} {m}", tok[(s, m)], colours[(s, m)]) for s, m in keys],
            title="Tokens per day",
        )
        if keys
        else empty_chart("No model call in this period.")
    )
    cost_chart = (
        stacked_bars(
            token_labels,
            [(f"{s} {m}", cost[(s, m)], colours[(s, m)]) for s, m in keys],
            title="Cost per day (USD)",
            unit="$",
        )
        if keys
        else empty_chart("No model call in this period.")
    )
    readers = board.readers
    read_days = sorted(board.reads)
    reads_chart = (
        stacked_bars(
            [d.isoformat() for d in read_days],
            [
                (r, [board.reads[d].get(r, 0) for d in read_days], PALETTE[i % len(PALETTE)])
                for i, r in enumerate(readers)
            ],
            title="Reasoning reads per day by reader",
        )
        if read_days
        else empty_chart("No reasoning read in this period.")
    )
    tools_chart = (
        stacked_bars(
            [t.tool for t in board.tools],
            [
                ("succeeded", [t.calls - t.failed for t in board.tools], GOOD),
                ("failed", [t.failed for t in board.tools], BAD),
            ],
            title="Tool calls by tool",
        )
        if board.tools
        else empty_chart("No tool call in this period.")
    )
    return {
        "runs": runs_chart,
        "tokens": tokens_chart,
        "cost": cost_chart,
        "tools": tools_chart,
        "reads": reads_chart,
    }


def _run_links(start: dt.datetime, end: dt.datetime) -> dict[str, str]:
    """The run list narrowed to the period and each figure's filter."""
    runs_url = reverse("admin:diagnosis_diagnosisrun_changelist")
    period = {
        "created_at__gte": start.isoformat(),
        "created_at__lt": end.isoformat(),
    }

    def runs_link(**filters: str) -> str:
        return runs_url + "?" + urlencode({**filters, **period})

    return {
        "runs": runs_link(),
        "incomplete": runs_link(audit_complete="no"),
        "unreconciled": runs_link(tokens_reconciled__exact="0"),
        # Each count of runs without a cost links to exactly the runs it counts.
        "cost_unavailable": runs_link(cost="unavailable"),
        "cost_demo": runs_link(cost="demo"),
        "cost_not_priced": runs_link(cost="not_priced"),
        "blocked": runs_link(release_decision__exact="BLOCKED"),
    }
