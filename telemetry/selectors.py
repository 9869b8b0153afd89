"""Reads of the export outbox: counts by state and the export lag (for the admin and /metrics)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone

from telemetry.models import ExportState, TraceExport


def exporter_enabled() -> bool:
    """Whether an OTLP traces endpoint is configured (`OTEL_EXPORTER_OTLP_*`)."""
    return bool(settings.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)


@dataclass(frozen=True, slots=True)
class ExportBacklog:
    """`by_state`: rows per state; `lag_seconds`: how long the oldest run not yet exported has been
    finished (0 when nothing waits)."""

    by_state: dict[str, int]
    lag_seconds: float


def export_backlog(*, now: dt.datetime | None = None) -> ExportBacklog:
    """Two aggregate queries over the outbox (the state index bounds the second)."""
    now = now or timezone.now()
    by_state = {state: 0 for state in ExportState.values}
    for row in TraceExport.objects.values("state").annotate(n=Count("id")).order_by():
        by_state[row["state"]] = row["n"]
    waiting = TraceExport.objects.filter(state__in=(ExportState.PENDING, ExportState.FAILED))
    oldest = waiting.aggregate(finished=Min("run_finished_at"), enqueued=Min("enqueued_at"))
    since = oldest["finished"] or oldest["enqueued"]
    lag = max(0.0, (now - since).total_seconds()) if since is not None else 0.0
    return ExportBacklog(by_state=by_state, lag_seconds=lag)


def export_of_run(*, run_id: str) -> TraceExport | None:
    return TraceExport.objects.filter(run_id=run_id).first()
