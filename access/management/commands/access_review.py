"""`manage.py access_review [--since ISO] [--csv]`: per sensitive permission, who held it during the
period, who used it, and grants never used (`access.review`)."""

from django.core.management.base import BaseCommand, CommandError

from access.review import access_review, parse_since, to_csv


class Command(BaseCommand):
    help = (
        "Access review since --since (ISO date or datetime, UTC when naive; default 90 days ago): for "
        "each sensitive permission (SENSITIVE_PERMISSIONS) who held it during the period (holders now "
        "and holds ended in it, from the governance log), who used it (reasoning reads from the access "
        "log, legal holds placed or lifted) and grants never used. --csv prints one row per user and "
        "permission."
    )

    def add_arguments(self, parser):
        parser.add_argument("--since", default=None)
        parser.add_argument("--csv", action="store_true")

    def handle(self, *args, **options):
        try:
            since = parse_since(options["since"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        review = access_review(since=since)
        if options["csv"]:
            self.stdout.write(to_csv(review), ending="")
            return
        self.stdout.write(f"access review {review.since.isoformat()} – {review.until.isoformat()}")
        for p in review.permissions:
            self.stdout.write(
                f"{p.permission}: held during the period by {len(p.held_during)}, used by {len(p.used_by)}, "
                f"{len(p.unused)} grant(s) never used"
            )
            for username, held_now, count, first, last in p.table:
                when = f" first {first.isoformat()} last {last.isoformat()}" if count else ""
                self.stdout.write(
                    f"  {username:20} {'holds' if held_now else 'held '} uses={count}{when}"
                    f"{'  UNUSED' if username in p.unused else ''}"
                )
