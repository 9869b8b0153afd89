"""`manage.py question_gaps [--since DATE] [--until DATE] [--below SCORE] [--threshold SIM] [--json]`:
the questions the runbooks do not answer in a period (`evaluations.gaps`), as text or JSON."""

from __future__ import annotations

import datetime as dt
import json

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date

from evaluations import clusters, gaps

DEFAULT_DAYS = 7


def _date(value: str, option: str) -> dt.date:
    try:
        parsed = parse_date(value)
    except ValueError:
        parsed = None
    if parsed is None:
        raise CommandError(f"{option} must be a date (YYYY-MM-DD), not {value!r}.")
    return parsed


def period(since: str | None, until: str | None) -> tuple[dt.datetime, dt.datetime]:
    """[since 00:00, the day after until 00:00) in UTC; until defaults to today, since to 6 days before."""
    last = _date(until, "--until") if until else timezone.now().date()
    first = _date(since, "--since") if since else last - dt.timedelta(days=DEFAULT_DAYS - 1)
    if last < first:
        raise CommandError(f"The period ends ({last}) before it starts ({first}).")
    start = dt.datetime.combine(first, dt.time(), tzinfo=dt.UTC)
    return start, dt.datetime.combine(last + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)


def as_json(report: gaps.GapReport) -> dict:
    return {
        "since": report.since.isoformat(),
        "until": report.until.isoformat(),
        "below": report.below,
        "runs": report.runs,
        "capped": report.capped,
        "questionsLeftOut": report.questions_left_out,
        "clustersLeftOut": report.clusters_left_out,
        "clusters": [
            {
                "terms": gap.terms,
                "statement": gap.statement,
                "question": gap.question,
                "runs": gap.runs,
                "questions": gap.questions,
                "reasons": gap.reasons,
                "runIds": [r.run_id for r in gap.run_links],
                "closest": None
                if gap.closest is None
                else {
                    "slug": gap.closest.slug,
                    "title": gap.closest.title,
                    "evidenceId": gap.closest.evidence_id,
                    "score": gap.closest.score,
                },
            }
            for gap in report.gaps
        ],
    }


class Command(BaseCommand):
    help = (
        "Group the redacted questions of the runs that were blocked, out of scope, voted down or scored "
        "low in a period (default: the last 7 days) and say which no runbook covers, with the closest."
    )

    def add_arguments(self, parser):
        parser.add_argument("--since", help="first day (YYYY-MM-DD, UTC); default: 6 days before --until")
        parser.add_argument("--until", help="last day, included (YYYY-MM-DD, UTC); default: today")
        parser.add_argument(
            "--below", type=float, default=gaps.DEFAULT_BELOW, help="a score below this is low (0..1)"
        )
        parser.add_argument(
            "--threshold",
            type=float,
            default=clusters.DEFAULT_THRESHOLD,
            help="mean cosine similarity at which questions join a group (0..1)",
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args, since=None, until=None, below: float, threshold: float, json: bool, **options):
        start, end = period(since, until)
        for name, value in (("--below", below), ("--threshold", threshold)):
            if not 0.0 <= value <= 1.0:
                raise CommandError(f"{name} must be between 0 and 1.")
        report = gaps.find_gaps(since=start, until=end, below=below, threshold=threshold)
        if json:
            self.stdout.write(_dumps(as_json(report)))
            return
        last = (end - dt.timedelta(days=1)).date()
        self.stdout.write(
            f"{report.runs} run(s) blocked, out of scope, voted down or scored below {below:g} from "
            f"{start.date()} to {last}{' (the newest only)' if report.capped else ''}: "
            f"{len(report.gaps) + report.clusters_left_out} group(s)."
        )
        for gap in report.gaps:
            reasons = ", ".join(f"{gaps.REASON_LABELS[k]} {n}" for k, n in sorted(gap.reasons.items()))
            self.stdout.write(f"\n{gap.runs} run(s), {gap.questions} question(s) [{reasons}]")
            self.stdout.write(f"  {gap.statement}")
            self.stdout.write(f"  e.g. {gap.question}")
            more = gap.runs - len(gap.run_links)
            self.stdout.write(
                "  runs: "
                + " ".join(r.run_id for r in gap.run_links)
                + (f" … and {more} more" if more else "")
            )
        if report.clusters_left_out:
            self.stdout.write(f"\n… and {report.clusters_left_out} smaller group(s).")
        if report.questions_left_out:
            self.stdout.write(f"{report.questions_left_out} run(s) with rarer questions were not grouped.")


def _dumps(data: dict) -> str:
    return json.dumps(data, ensure_ascii=False, indent=2)
