"""`manage.py purge_reasoning [--older-than DAYS] [--run RUN_ID]`: erase reasoning content, keep the rows."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.write.reasoning_changes import purge_reasoning


class Command(BaseCommand):
    help = (
        "Erase reasoning and assistant text of rows older than DAYS (default REASONING_RETENTION_DAYS) "
        "and/or of one run (right to erasure). Rows stay, with reasoning_available as it was and "
        "purged_at set; the API then shows purged: true. Idempotent."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            type=int,
            metavar="DAYS",
            help="purge rows created more than DAYS days ago (default: REASONING_RETENTION_DAYS, "
            "unless --run is given alone)",
        )
        parser.add_argument("--run", metavar="RUN_ID", help="purge this run's rows (any age)")

    def handle(self, *args, **options):
        days, run_id = options["older_than"], options["run"]
        if days is None and not run_id:
            days = settings.REASONING_RETENTION_DAYS
        if days is not None and days < 0:
            raise CommandError("--older-than must be 0 or more days")
        stats: dict[str, int] = {}
        purged = purge_reasoning(older_than_days=days, run_id=run_id, stats=stats)
        scope = []
        if days is not None:
            scope.append(f"older than {days} day(s)")
        if run_id:
            scope.append(f"of run {run_id}")
        self.stdout.write(f"purged {purged} reasoning row(s) {' and '.join(scope)}")
        if stats.get("tampered"):
            self.stdout.write(
                f"left {stats['tampered']} row(s) as they are: they do not match the digest their chain "
                "binds (verify_audit names them)"
            )
