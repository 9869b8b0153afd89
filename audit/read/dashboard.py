"""The oversight dashboard's numbers for a period [since, until), aggregated in SQL and bounded: a fixed
number of queries whatever the number of runs (one per figure, plus four for the percentiles), each
returning one row per day (and source, model, tool or reader), never a row per run.

* runs per day by release decision (FAILED/CANCELLED runs without one count as `none`), block rate
  (BLOCKED of released), audit-incomplete and unreconciled terminal runs, stored cost per day (priced
  runs' sum, and the runs whose cost is unavailable or demo, counted);
* p50 / p95 of run latency (`total_duration_ms`) and first-output latency over the period, nearest rank
  (the value at rank ⌈p·n⌉ of the n known values): one count query, then one `ORDER BY … LIMIT 1 OFFSET
  k` per percentile, which SQLite and MariaDB both read from an index range (no window function needed);
* tokens per day by source and model from the calls' MODEL_TOKEN_USAGE records, with their cost by the
  pricing rule (`pricing.rules`) applied to each day's sums at that day's prices (exact for per-token
  prices; tiered prices would be priced on the sum); calls without usage counted;
* tool calls and failures by tool (FAILED, INTERRUPTED, ABANDONED count as failed);
* reasoning reads per day by reader (`reasoning_access_log`);
* readers' feedback (👍 / 👎) given or changed in the period, by rating (`run_feedback`).

Days are UTC dates (`TIME_ZONE`).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from django.db.models import BigIntegerField, Count, Exists, IntegerField, OuterRef, Q, Subquery, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, TruncDate

from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun, ReleaseDecision, RunFeedback
from diagnosis.selectors import PRODUCTION, production
from pricing.costs import load_price_book
from pricing.rules import CallTokens, CostStatus, PriceBook
from reasoning.models import ReasoningAccessLog

FAILED_TOOL_STATUSES = (ToolStatus.FAILED, ToolStatus.INTERRUPTED, ToolStatus.ABANDONED)
PERCENTILES = (50, 95)


@dataclass(slots=True)
class DayRuns:
    day: dt.date
    published: int = 0
    blocked: int = 0
    no_release: int = 0
    audit_incomplete: int = 0
    unreconciled: int = 0
    cost: Decimal | None = None  # sum of the priced runs' cost (None: none priced)
    cost_unavailable: int = 0  # terminal runs whose cost is unavailable, demo or not priced
    # ... split by why, each what the run list's cost filter of that name shows:
    cost_unpriced_call: int = 0  # `unavailable`: a call the price table could not price
    cost_demo: int = 0  # `demo`: the demo model has no price
    cost_not_priced: int = 0  # `not_priced`: not priced yet

    @property
    def runs(self) -> int:
        return self.published + self.blocked + self.no_release

    @property
    def block_rate(self) -> float | None:
        released = self.published + self.blocked
        return self.blocked / released if released else None


@dataclass(slots=True)
class TokenRow:
    day: dt.date | None  # None when summed over the whole period
    source: str
    model: str
    provider: str
    calls: int
    without_usage: int
    prompt: int
    completion: int
    cached: int
    reasoning: int
    total: int
    cost: Decimal | None
    cost_status: str


@dataclass(slots=True)
class ToolRow:
    tool: str
    calls: int
    failed: int

    @property
    def failure_rate(self) -> float:
        return self.failed / self.calls if self.calls else 0.0


@dataclass(slots=True)
class Dashboard:
    since: dt.datetime
    until: dt.datetime
    days: list[DayRuns]
    latency: dict[str, dict[int, int | None]]  # metric -> percentile -> ms
    tokens: list[TokenRow]
    tools: list[ToolRow]
    reads: dict[dt.date, dict[str, int]] = field(default_factory=dict)
    # Readers' feedback given (or last changed) in the period: votes by rating ("up", "down").
    feedback: dict[str, int] = field(default_factory=dict)

    @property
    def totals(self) -> DayRuns:
        out = DayRuns(day=self.since.date())
        for d in self.days:
            out.published += d.published
            out.blocked += d.blocked
            out.no_release += d.no_release
            out.audit_incomplete += d.audit_incomplete
            out.unreconciled += d.unreconciled
            out.cost_unavailable += d.cost_unavailable
            out.cost_unpriced_call += d.cost_unpriced_call
            out.cost_demo += d.cost_demo
            out.cost_not_priced += d.cost_not_priced
            if d.cost is not None:
                out.cost = (out.cost or Decimal(0)) + d.cost
        return out

    @property
    def readers(self) -> list[str]:
        return sorted({r for per_day in self.reads.values() for r in per_day})


def _percentiles(runs, column: str) -> dict[int, int | None]:
    known = runs.filter(**{f"{column}__isnull": False})
    n = known.count()
    out: dict[int, int | None] = {}
    for p in PERCENTILES:
        if n == 0:
            out[p] = None
            continue
        k = max(1, math.ceil(p / 100 * n))
        out[p] = known.order_by(column).values_list(column, flat=True)[k - 1 : k].get()
    return out


def get_dashboard(*, since: dt.datetime, until: dt.datetime) -> Dashboard:
    runs = production(DiagnosisRun.objects.filter(created_at__gte=since, created_at__lt=until))
    terminal = Q(status__in=TERMINAL_RUN_STATUSES)
    per_day = (
        runs.annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(
            published=Count("id", filter=Q(release_decision=ReleaseDecision.PUBLISHED)),
            blocked=Count("id", filter=Q(release_decision=ReleaseDecision.BLOCKED)),
            no_release=Count("id", filter=Q(release_decision__isnull=True)),
            audit_incomplete=Count("id", filter=terminal & Q(audit_complete=False)),
            unreconciled=Count("id", filter=terminal & Q(tokens_reconciled=False)),
            cost=Sum("cost", filter=Q(cost_status=CostStatus.PRICED)),
            cost_unavailable=Count("id", filter=terminal & ~Q(cost_status=CostStatus.PRICED)),
            cost_unpriced_call=Count("id", filter=terminal & Q(cost_status=CostStatus.UNAVAILABLE)),
            cost_demo=Count("id", filter=terminal & Q(cost_status=CostStatus.DEMO)),
            cost_not_priced=Count("id", filter=terminal & Q(cost_status=CostStatus.NOT_PRICED)),
        )
        .order_by("day")
    )
    # Every day of the period, those without a run as zeros (a chart with gaps reads as "no data").
    found = {row["day"]: DayRuns(**row) for row in per_day}
    first, last = since.date(), (until - dt.timedelta(microseconds=1)).date()
    days = [
        found.get(first + dt.timedelta(days=i)) or DayRuns(day=first + dt.timedelta(days=i))
        for i in range((last - first).days + 1)
    ]

    latency = {
        "run": _percentiles(runs, "total_duration_ms"),
        "first_output": _percentiles(runs, "first_output_latency_ms"),
    }

    token_rows = priced_usage(since=since, until=until, book=load_price_book())

    tools = [
        ToolRow(tool=row["tool_name"], calls=row["calls"], failed=row["failed"])
        for row in ToolInvocation.objects.filter(created_at__gte=since, created_at__lt=until)
        .values("tool_name")
        .annotate(calls=Count("id"), failed=Count("id", filter=Q(status__in=FAILED_TOOL_STATUSES)))
        .order_by("tool_name")
    ]

    reads: dict[dt.date, dict[str, int]] = defaultdict(dict)
    for row in (
        ReasoningAccessLog.objects.filter(accessed_at__gte=since, accessed_at__lt=until)
        .annotate(day=TruncDate("accessed_at"))
        .values("day", "username")
        .annotate(n=Count("id"))
        .order_by("day", "username")
    ):
        reads[row["day"]][row["username"]] = row["n"]
    feedback = dict(
        RunFeedback.objects.filter(updated_at__gte=since, updated_at__lt=until)
        .filter(run__in=production(DiagnosisRun.objects.all()).values("run_id"))
        .values("rating")
        .annotate(n=Count("id"))
        .order_by("rating")
        .values_list("rating", "n")
    )
    return Dashboard(
        feedback={"up": feedback.get("up", 0), "down": feedback.get("down", 0)},
        since=since,
        until=until,
        days=days,
        latency=latency,
        tokens=token_rows,
        tools=tools,
        reads=dict(reads),
    )


def priced_usage(
    *, since: dt.datetime, until: dt.datetime, book: PriceBook, by_day: bool = True
) -> list[TokenRow]:
    """The MODEL_TOKEN_USAGE records created in [since, until), summed per (day,) source, model and the
    run's provider in one query (read through the `(event_type, created_at)` index), each sum priced by
    the pricing rule at that day's noon (or at `until` when not `by_day`). Also `/metrics`' cost."""

    def tokens(key: str):
        return Sum(Cast(KT(f"details__{key}"), BigIntegerField()), filter=Q(status="REPORTED"))

    provider = DiagnosisRun.objects.filter(run_id=OuterRef("run_id")).values("provider")[:1]
    # Experiment replays' calls are no production spend (`diagnosis.selectors.PRODUCTION`).
    experiment = DiagnosisRun.objects.filter(run_id=OuterRef("run_id")).exclude(PRODUCTION)
    events = (
        TraceEvent.objects.filter(
            event_type=EventType.MODEL_TOKEN_USAGE, created_at__gte=since, created_at__lt=until
        )
        .exclude(Exists(experiment))
        .annotate(run_provider=Subquery(provider))
    )
    group = ["run_provider"]
    if by_day:
        events = events.annotate(day=TruncDate("created_at"))
        group.insert(0, "day")
    rows = (
        events.values(*group, source=KT("details__source"), model=KT("details__model"))
        .annotate(
            calls=Count("id"),
            without_usage=Count("id", filter=~Q(status="REPORTED"), output_field=IntegerField()),
            prompt=tokens("promptTokens"),
            completion=tokens("completionTokens"),
            cached=tokens("cachedTokens"),
            reasoning=tokens("reasoningTokens"),
            total=tokens("totalTokens"),
        )
        .order_by(*group, "source", "model")
    )
    out = []
    for row in rows:
        day = row.get("day")
        at = dt.datetime.combine(day, dt.time(12), tzinfo=dt.UTC) if day else until
        priced = book.price_call(
            provider=row["run_provider"] or "",
            model=row["model"] or "",
            tokens=CallTokens(
                prompt=row["prompt"] or 0,
                completion=row["completion"] or 0,
                reasoning=None,  # inside the completion counts already
                cached=row["cached"] or 0,
                available=row["calls"] > row["without_usage"],
            ),
            at=at,
        )
        out.append(
            TokenRow(
                day=day,
                source=str(row["source"] or ""),
                model=str(row["model"] or ""),
                provider=str(row["run_provider"] or ""),
                calls=row["calls"],
                without_usage=row["without_usage"],
                prompt=row["prompt"] or 0,
                completion=row["completion"] or 0,
                cached=row["cached"] or 0,
                reasoning=row["reasoning"] or 0,
                total=row["total"] or 0,
                cost=priced.amount,
                cost_status=priced.status,
            )
        )
    return out


__all__ = ["Dashboard", "DayRuns", "TokenRow", "ToolRow", "get_dashboard", "priced_usage"]
