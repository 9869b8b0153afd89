"""The export outbox: which finished runs are to be exported as traces, exporting them, and retrying.

`enqueue_finished_runs` adds a PENDING row per terminal run since its cursor (nothing on a run's path
writes here); `export_due` claims due rows with a conditional update (no two processes export one row at
once), projects each run's durable record (`telemetry.spans`) and sends it over OTLP/HTTP, retrying a
failure with exponential back-off until it succeeds; `requeue` re-exports (`manage.py export_otel`).
Export is idempotent and off while no `OTEL_EXPORTER_OTLP_*` endpoint is set.
Details: docs/observability.md, *The export is a projection of the audit, not a second source*.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, Min, OuterRef
from django.utils import timezone

from audit.payloads import clip
from audit.read import get_trace
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun
from telemetry.models import ERROR_CHARS, ExportCursor, ExportState, TraceExport
from telemetry.spans import project_trace, resource

logger = logging.getLogger(__name__)

SCAN_SLACK = dt.timedelta(minutes=10)
SCAN_BATCH = 1000
BACKOFF_BASE_SECONDS = 2.0
# A claimed row is due again after this long if its exporter never came back (a killed process).
CLAIM_SECONDS = 120.0
REQUEUE_CHUNK = 500


def make_exporter(endpoint: str | None = None):
    """The OTLP/HTTP span exporter for the configured endpoint (the other `OTEL_EXPORTER_OTLP_*`
    variables are read by the exporter itself)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint or settings.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)


# -------------------------------------------------------------------------------------------------
# Enqueue
# -------------------------------------------------------------------------------------------------
def enqueue_finished_runs(*, now: dt.datetime | None = None, limit: int = SCAN_BATCH) -> int:
    """Insert a PENDING row for every terminal run since the cursor that has none; returns how many."""
    now = now or timezone.now()
    cursor, _ = ExportCursor.objects.get_or_create(id=1)
    runs = DiagnosisRun.objects.all()
    if cursor.scan_from is not None:
        runs = runs.filter(created_at__gte=cursor.scan_from)
    missing = (
        runs.filter(status__in=TERMINAL_RUN_STATUSES)
        .exclude(Exists(TraceExport.objects.filter(run_id=OuterRef("run_id"))))
        .order_by("created_at")
        .values_list("run_id", "finished_at", "created_at")[:limit]
    )
    found = list(missing)
    TraceExport.objects.bulk_create(
        [
            TraceExport(run_id=run_id, run_finished_at=finished_at, enqueued_at=now, next_attempt_at=now)
            for run_id, finished_at, _ in found
        ],
        ignore_conflicts=True,
    )
    if len(found) < limit:
        oldest_open = runs.exclude(status__in=TERMINAL_RUN_STATUSES).aggregate(m=Min("created_at"))["m"]
        scan_from = min(oldest_open or now, now - SCAN_SLACK)
        if cursor.scan_from is None or scan_from > cursor.scan_from:
            ExportCursor.objects.filter(id=1).update(scan_from=scan_from, updated_at=now)
    return len(found)


# -------------------------------------------------------------------------------------------------
# Export
# -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ExportPass:
    exported: int
    failed: int
    skipped: int
    spans: int


def backoff_seconds(attempts: int) -> float:
    cap = float(settings.OTEL_EXPORT_MAX_BACKOFF_SECONDS)
    return min(cap, BACKOFF_BASE_SECONDS * (2 ** max(0, attempts - 1)))


def _claim(row: TraceExport, now: dt.datetime) -> bool:
    claimed = TraceExport.objects.filter(
        pk=row.pk, state=row.state, next_attempt_at=row.next_attempt_at
    ).update(next_attempt_at=now + dt.timedelta(seconds=CLAIM_SECONDS))
    return claimed == 1


def due_exports(*, now: dt.datetime, limit: int) -> list[TraceExport]:
    return list(
        TraceExport.objects.filter(
            state__in=(ExportState.PENDING, ExportState.FAILED), next_attempt_at__lte=now
        ).order_by("next_attempt_at", "id")[:limit]
    )


def export_due(
    *, exporter: Any = None, now: dt.datetime | None = None, limit: int | None = None
) -> ExportPass:
    """Export every due row (at most `limit`, default `OTEL_EXPORT_BATCH`) with `exporter` (default:
    `make_exporter()`, shut down afterwards)."""
    now = now or timezone.now()
    limit = limit or int(settings.OTEL_EXPORT_BATCH)
    rows = due_exports(now=now, limit=limit)
    if not rows:
        return ExportPass(0, 0, 0, 0)
    own = exporter is None
    exporter = exporter or make_exporter()
    exported = failed = skipped = spans = 0
    try:
        for row in rows:
            if not _claim(row, now):
                continue
            outcome = export_row(row=row, exporter=exporter)
            if outcome.state == ExportState.EXPORTED:
                exported += 1
                spans += outcome.span_count or 0
            elif outcome.state == ExportState.SKIPPED:
                skipped += 1
            else:
                failed += 1
    finally:
        if own:
            exporter.shutdown()
    return ExportPass(exported, failed, skipped, spans)


def export_row(*, row: TraceExport, exporter: Any) -> TraceExport:
    """Export one run's trace now and record the outcome on its row (returned, updated)."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    attempts = row.attempts + 1
    run = DiagnosisRun.objects.filter(run_id=row.run_id).select_related("session").first()
    if run is None:
        return _finish(row, state=ExportState.SKIPPED, attempts=attempts, error="run records purged")
    try:
        spans = project_trace(get_trace(run=run), resource_=resource())
    except Exception as exc:  # a projection bug must not stop the other runs' export
        logger.error("trace projection failed run=%s error=%s", row.run_id, type(exc).__name__)
        return _fail(row, attempts=attempts, error=f"projection failed: {type(exc).__name__}")
    try:
        result = exporter.export(spans)
    except Exception as exc:
        logger.warning("otlp export raised run=%s error=%s", row.run_id, type(exc).__name__)
        return _fail(row, attempts=attempts, error=f"exporter raised {type(exc).__name__}")
    if result != SpanExportResult.SUCCESS:
        logger.warning("otlp export failed run=%s attempts=%d", row.run_id, attempts)
        return _fail(row, attempts=attempts, error="the OTLP endpoint did not accept the spans")
    return _finish(row, state=ExportState.EXPORTED, attempts=attempts, span_count=len(spans))


def _fail(row: TraceExport, *, attempts: int, error: str) -> TraceExport:
    next_at = timezone.now() + dt.timedelta(seconds=backoff_seconds(attempts))
    return _finish(row, state=ExportState.FAILED, attempts=attempts, error=error, next_attempt_at=next_at)


def _finish(
    row: TraceExport,
    *,
    state: str,
    attempts: int,
    error: str = "",
    span_count: int | None = None,
    next_attempt_at: dt.datetime | None = None,
) -> TraceExport:
    now = timezone.now()
    fields: dict[str, Any] = {
        "state": state,
        "attempts": attempts,
        "last_error": clip(error, ERROR_CHARS),
        "next_attempt_at": next_attempt_at or now,
    }
    if state == ExportState.EXPORTED:
        fields.update(exported_at=now, span_count=span_count)
    TraceExport.objects.filter(pk=row.pk).update(**fields)
    for key, value in fields.items():
        setattr(row, key, value)
    return row


# -------------------------------------------------------------------------------------------------
# Re-queue (backfill)
# -------------------------------------------------------------------------------------------------
def requeue(*, run_ids: Iterable[str] = (), since: dt.datetime | None = None) -> int:
    """Put the given runs, or every terminal run finished since `since`, (back) to PENDING, due now;
    returns how many rows are pending for them."""
    now = timezone.now()
    runs = DiagnosisRun.objects.filter(status__in=TERMINAL_RUN_STATUSES)
    run_ids = list(run_ids)
    if run_ids:
        runs = runs.filter(run_id__in=run_ids)
    if since is not None:
        runs = runs.filter(finished_at__gte=since)
    found = list(runs.values_list("run_id", "finished_at"))
    pending = 0
    for start in range(0, len(found), REQUEUE_CHUNK):
        chunk = found[start : start + REQUEUE_CHUNK]
        with transaction.atomic():
            TraceExport.objects.bulk_create(
                [
                    TraceExport(run_id=run_id, run_finished_at=finished, enqueued_at=now, next_attempt_at=now)
                    for run_id, finished in chunk
                ],
                ignore_conflicts=True,
            )
            pending += TraceExport.objects.filter(run_id__in=[r for r, _ in chunk]).update(
                state=ExportState.PENDING, next_attempt_at=now, last_error=""
            )
    return pending


def run_export_pass(*, exporter: Any = None) -> ExportPass:
    """One pass of the server's exporter duty: enqueue newly finished runs, export the due ones."""
    enqueue_finished_runs()
    return export_due(exporter=exporter)
