"""`manage.py export_otel [--since ISO] [--run RUN_ID ...] [--endpoint URL]`: (re-)export finished runs
as OpenTelemetry traces now (backfill). Runs are put (back) in the outbox as PENDING and exported in
this process; failures stay in the outbox for the server's exporter duty to retry."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from telemetry.outbox import enqueue_finished_runs, export_due, make_exporter, requeue
from telemetry.selectors import exporter_enabled


class Command(BaseCommand):
    help = "Export finished runs as OpenTelemetry GenAI traces to the configured OTLP endpoint."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--since", help="Re-export runs finished at or after this ISO 8601 time.")
        parser.add_argument("--run", action="append", default=[], help="Re-export this run (repeatable).")
        parser.add_argument("--endpoint", help="OTLP/HTTP traces endpoint (default: OTEL_EXPORTER_OTLP_*).")

    def handle(self, *args, since=None, run=(), endpoint=None, **options) -> None:
        if not endpoint and not exporter_enabled():
            raise CommandError("No OTLP endpoint: set OTEL_EXPORTER_OTLP_ENDPOINT or pass --endpoint.")
        moment = None
        if since:
            moment = parse_datetime(since)
            if moment is None or moment.tzinfo is None:
                raise CommandError("--since must be an ISO 8601 time with a timezone, e.g. 2026-01-31T00:00Z")
        if run or moment is not None:
            queued = requeue(run_ids=run, since=moment)
            if run and queued < len(set(run)):
                self.stderr.write(f"{len(set(run)) - queued} run(s) not found or not finished")
        else:
            queued = enqueue_finished_runs()
        exporter = make_exporter(endpoint)
        totals = [0, 0, 0, 0]
        try:
            while True:
                done = export_due(exporter=exporter)
                for i, value in enumerate((done.exported, done.failed, done.skipped, done.spans)):
                    totals[i] += value
                if not done.exported and not done.skipped:
                    break
        finally:
            exporter.shutdown()
        exported, failed, skipped, spans = totals
        self.stdout.write(
            f"exported {exported} run(s) ({spans} spans), {failed} failed (retried later), "
            f"{skipped} skipped (purged)"
        )
        if failed:
            raise CommandError(f"{failed} run(s) could not be exported; they stay in the outbox")
