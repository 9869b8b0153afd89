"""The OTLP export outbox: one row per finished run that is to be, or was, exported as a trace.

Rows are written by `telemetry.outbox` only: enqueued by a periodic scan of runs that finished (never on
a run's path), then moved by the exporter duty from PENDING to EXPORTED, or to FAILED with a bounded,
content-free error and the time of the next attempt (back-off), and back to PENDING when re-queued
(`manage.py export_otel`). Export is idempotent (trace and span ids derive from the run and its record
ids), so a row exported twice is the same trace twice. `ExportCursor` (pk 1) is the scan's watermark.
The run is referenced by its opaque id without a constraint, like the audit rows (seed 000).
"""

from django.db import models

ERROR_CHARS = 300


class ExportState(models.TextChoices):
    PENDING = "PENDING"
    EXPORTED = "EXPORTED"
    FAILED = "FAILED"  # retried at `next_attempt_at`
    SKIPPED = "SKIPPED"  # the run's records are gone (purged): nothing left to export


class TraceExport(models.Model):
    """The export state of one run's trace (`telemetry_trace_export`)."""

    run_id = models.CharField(max_length=64, unique=True)
    state = models.CharField(max_length=16, choices=ExportState.choices, default=ExportState.PENDING)
    attempts = models.IntegerField(default=0)
    last_error = models.CharField(max_length=ERROR_CHARS, blank=True, default="")
    run_finished_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField()
    exported_at = models.DateTimeField(null=True, blank=True)
    span_count = models.IntegerField(null=True, blank=True)

    class Meta:
        db_table = "telemetry_trace_export"
        verbose_name = "trace export"
        ordering = ["-enqueued_at"]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="idx_export_state_next")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.state}"


class ExportCursor(models.Model):
    """The one row (pk 1) bounding the scan for finished runs: every run created before `scan_from`
    is terminal and enqueued (NULL: scan all)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    scan_from = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "telemetry_export_cursor"

    def __str__(self) -> str:
        return f"export scan from {self.scan_from}"
