"""`manage.py make_dataset NAME [--verdict incorrect] [--since DATE] [--until DATE] [--status …]
[--release …] [--intent …] [--config FINGERPRINT] [--run RUN_ID [RUN_ID …]]`: a new version of dataset
NAME with the production runs the run list's filters select (`diagnosis.selectors.runs_matching`), or
the runs named (several after one `--run`, or `--run` repeated); prints the version and its item count."""

from __future__ import annotations

import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_date, parse_datetime

from diagnosis.selectors import runs_matching
from experiments.datasets import MAX_ADD as MAX_RUNS
from experiments.datasets import DatasetError, add_runs


def _when(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    value = parse_datetime(text)
    if value is None:
        day = parse_date(text)
        if day is None:
            raise CommandError(f"not a date: {text}")
        value = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


class Command(BaseCommand):
    help = "Add runs (by the run list's filters, or by id) to a new version of a dataset."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--verdict", default="", help="latest review verdict, e.g. incorrect")
        parser.add_argument("--since", help="created at or after (date or ISO time, UTC)")
        parser.add_argument("--until", help="created before (date or ISO time, UTC)")
        parser.add_argument("--status", default="")
        parser.add_argument("--release", default="", help="PUBLISHED or BLOCKED")
        parser.add_argument("--intent", default="")
        parser.add_argument("--config", default="", help="configuration fingerprint")
        parser.add_argument(
            "--run",
            nargs="+",
            action="extend",
            default=[],
            metavar="RUN_ID",
            help="run ids: --run A B C, or --run A --run B (the dataset's name comes before them)",
        )
        parser.add_argument("--note", default="")

    def handle(self, *args, **options):
        if options["run"]:
            runs = options["run"]
            note = options["note"] or f"{len(runs)} run(s) by id"
        else:
            query = runs_matching(
                review_verdict=options["verdict"],
                created_after=_when(options["since"]),
                created_before=_when(options["until"]),
                status=options["status"],
                release_decision=options["release"],
                intent=options["intent"],
                config_fingerprint=options["config"],
            )
            runs = list(query.values_list("run_id", flat=True)[: MAX_RUNS + 1])
            if len(runs) > MAX_RUNS:
                raise CommandError(f"more than {MAX_RUNS} runs match: narrow the filter")
            filters = {
                k: options[k] for k in ("verdict", "since", "until", "status", "release", "intent", "config")
            }
            note = options["note"] or "filter " + ", ".join(f"{k}={v}" for k, v in filters.items() if v)
        try:
            dataset = add_runs(name=options["name"], runs=runs, by="manage.py", note=note)
        except DatasetError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{dataset.name} v{dataset.version}: {dataset.item_count} items")
