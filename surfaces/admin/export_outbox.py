"""Read-only admin of the export outbox: each run's export state, attempts, last error and lag."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from core.admin_base import ReadOnlyAdmin
from telemetry.models import TraceExport


@admin.register(TraceExport)
class TraceExportAdmin(ReadOnlyAdmin):
    """Rows change only through the exporter (`telemetry.outbox`) and `manage.py export_otel`."""

    list_display = ("run_id", "state", "attempts", "span_count", "run_finished_at", "exported_at", "lag")
    list_filter = ("state",)
    search_fields = ("run_id",)
    ordering = ("-enqueued_at",)
    fields = (
        "run_id",
        "state",
        "attempts",
        "last_error",
        "span_count",
        "run_finished_at",
        "enqueued_at",
        "next_attempt_at",
        "exported_at",
        "lag",
    )
    readonly_fields = fields

    @admin.display(description="lag")
    def lag(self, obj: TraceExport) -> str:
        """Finish to export; for a run still waiting, finish to now."""
        since = obj.run_finished_at or obj.enqueued_at
        until = obj.exported_at or timezone.now()
        seconds = max(0.0, (until - since).total_seconds())
        label = f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
        return label if obj.exported_at else f"{label} (waiting)"
