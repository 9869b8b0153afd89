"""`manage.py export_traces --since 2026-11-01 --until 2026-12-01 [--format jsonl|parquet] [--output FILE]`:
the traces of the runs created in [since, until) in the API's trace shape (no reasoning), streamed chunk
by chunk (`surfaces.api.trace_export`). JSON Lines go to stdout unless `--output` names a file; Parquet needs
`--output` and pyarrow."""

from __future__ import annotations

import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from diagnosis.models import DiagnosisRun
from surfaces.api.trace_export import ParquetUnavailable, jsonl_lines, write_parquet


def _moment(text: str, option: str) -> dt.datetime:
    value = parse_datetime(text)
    if value is None:
        day = parse_date(text)
        if day is None:
            raise CommandError(f"{option}: not a date or date-time: {text!r}")
        value = dt.datetime.combine(day, dt.time())
    if timezone.is_naive(value):
        value = timezone.make_aware(value, dt.UTC)
    return value


class Command(BaseCommand):
    help = (
        "Export the traces of the runs created in [--since, --until) in the API's trace shape (never "
        "reasoning), as JSON Lines (default, to stdout or --output) or Parquet (--output, needs pyarrow)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--since", required=True, help="date or ISO date-time (UTC when no offset)")
        parser.add_argument("--until", required=True, help="exclusive; date or ISO date-time")
        parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
        parser.add_argument("--output", default="", help="file to write (required for parquet)")
        parser.add_argument("--chunk", type=int, default=200, help="runs read per batch")

    def handle(self, *args, **options):
        since, until = _moment(options["since"], "--since"), _moment(options["until"], "--until")
        if until <= since:
            raise CommandError("--until must be after --since")
        runs = DiagnosisRun.objects.filter(created_at__gte=since, created_at__lt=until)
        chunk = max(1, options["chunk"])
        if options["format"] == "parquet":
            if not options["output"]:
                raise CommandError("--format parquet needs --output FILE")
            try:
                with open(options["output"], "wb") as out:
                    n = write_parquet(runs, out, chunk=chunk)
            except ParquetUnavailable as exc:
                raise CommandError(str(exc)) from exc
            self.stderr.write(f"exported {n} trace(s) to {options['output']}")
            return
        n = 0
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8") as out:
                for line in jsonl_lines(runs, chunk=chunk):
                    out.write(line)
                    n += 1
        else:
            for line in jsonl_lines(runs, chunk=chunk):
                self.stdout.write(line, ending="")
                n += 1
        self.stderr.write(f"exported {n} trace(s)")
