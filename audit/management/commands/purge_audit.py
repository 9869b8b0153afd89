"""`manage.py purge_audit [--older-than DAYS]`: purge the trace records of runs past retention, keeping
tombstones and their leaves in the transparency log."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.write.retention import purge_expired_runs


class Command(BaseCommand):
    help = (
        "Delete the trace records (events, steps, tools, reasoning rows, feedback, the run row) of every "
        "anchored run that finished more than DAYS days ago (default AUDIT_RETENTION_DAYS) and is not "
        "under a legal hold, leaving a tombstone per run and its leaf in the transparency log, so that "
        "verify_audit still passes and says what was purged and when. Checkpoints first."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than", type=int, metavar="DAYS", help="retention in days (default AUDIT_RETENTION_DAYS)"
        )

    def handle(self, *args, **options):
        days = options["older_than"]
        if days is not None and days < 0:
            raise CommandError("--older-than must be 0 or more days")
        report = purge_expired_runs(retention_days=days)
        rows = ", ".join(f"{n} {name}" for name, n in sorted(report.rows.items())) or "no rows"
        self.stdout.write(
            f"purged {len(report.purged)} run(s) finished before {report.cutoff.isoformat()} ({rows}); "
            f"kept {report.held} under legal hold; {report.unanchored} not anchored yet"
        )
        configured = settings.AUDIT_RETENTION_DAYS
        if days is not None and days < configured:
            self.stdout.write(
                f"note: {days} day(s) is shorter than AUDIT_RETENTION_DAYS ({configured}); "
                "verify_audit reports runs purged before the configured retention"
            )
