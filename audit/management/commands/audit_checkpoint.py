"""`manage.py audit_checkpoint [--full]`: append finished runs to the transparency log, sign a checkpoint."""

from django.core.management.base import BaseCommand

from audit.transparency.log import APPEND_BATCH, checkpoint, newest_checkpoint


class Command(BaseCommand):
    help = (
        "Append every finished run not yet in the transparency log (in one global order, under the "
        "log's lock) and sign a checkpoint of the new size with the newest AUDIT_SIGNING_KEYS key. "
        "Signs nothing when no run is waiting. --full searches every run instead of those created "
        "since the oldest one still unfinished."
    )

    def add_arguments(self, parser):
        parser.add_argument("--full", action="store_true", help="search every run, not only recent ones")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=APPEND_BATCH,
            help="runs appended (and one checkpoint) per transaction",
        )

    def handle(self, *args, **options):
        result = checkpoint(full_scan=options["full"], batch_size=max(1, options["batch_size"]))
        for cp in result.checkpoints:
            self.stdout.write(
                f"checkpoint tree_size={cp.tree_size} root={cp.root_hash} key={cp.key_id} "
                f"signed_at={cp.signed_at.isoformat()} hash={cp.checkpoint_hash}"
            )
        if not result.checkpoints:
            newest = newest_checkpoint()
            where = (
                f"newest checkpoint tree_size={newest.tree_size} signed_at={newest.signed_at.isoformat()}"
                if newest
                else "no checkpoint yet"
            )
            self.stdout.write(f"no finished run waiting; {where}")
        else:
            governance = (
                f", the governance chain up to event {result.governance_anchored}"
                if result.governance_anchored
                else ""
            )
            self.stdout.write(f"appended {result.appended} run(s){governance}; log holds {result.tree_size}")
