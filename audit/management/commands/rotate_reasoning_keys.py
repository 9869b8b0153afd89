"""`manage.py rotate_reasoning_keys`: re-encrypt every reasoning row under the newest configured key."""

from django.core.management.base import BaseCommand, CommandError

from audit.write.reasoning_changes import ROTATE_BATCH, rotate_reasoning_keys


class Command(BaseCommand):
    help = (
        "Re-encrypt reasoning and assistant text that is not under the newest key of "
        "REASONING_ENCRYPTION_KEYS (older keys must still be configured, after it), and encrypt legacy "
        "plaintext rows. Batched and idempotent; prints counts. Exits 1 if some rows could not be "
        "decrypted with any configured key. Afterwards the old keys can be removed."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=ROTATE_BATCH, help="rows per transaction")

    def handle(self, *args, **options):
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        report = rotate_reasoning_keys(batch_size=options["batch_size"])
        self.stdout.write(
            f"newest key {report.key_id}: scanned {report.scanned}, re-encrypted {report.rotated}, "
            f"encrypted from plaintext {report.encrypted}, unreadable {report.unreadable}, "
            f"skipped (purged meanwhile) {report.skipped}, left as they are (do not match their chained "
            f"digests: verify_audit names them) {report.tampered}"
        )
        if report.unreadable:
            raise CommandError(
                f"{report.unreadable} row(s) are under a key that is no longer configured; add that key "
                "back (after the newest) and run again"
            )
