"""`manage.py audit_checkpoint [--incremental]`: append finished runs whose record authenticates to the
transparency log, sign a checkpoint. It searches every run unless told to trust the search cursor."""

from django.core.management.base import BaseCommand

from audit.transparency.log import APPEND_BATCH, checkpoint, newest_checkpoint


class Command(BaseCommand):
    help = (
        "Append every finished run not yet in the transparency log whose record authenticates (chain, "
        "write tags, row digests; a run that does not is refused, named and recorded once in the "
        "governance chain) in one global order, under the log's lock, and sign a checkpoint of the new "
        "size with the newest AUDIT_SIGNING_KEYS key. Signs nothing when no run is waiting. Searches "
        "every run; --incremental only those created since the stored search cursor (an optimisation "
        "a database writer can move)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--incremental",
            action="store_true",
            help="search only runs created since the stored cursor (the server's checkpointer does so "
            "between its full scans)",
        )
        parser.add_argument("--full", action="store_true", help="search every run (the default)")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=APPEND_BATCH,
            help="runs appended (and one checkpoint) per transaction",
        )

    def handle(self, *args, **options):
        full = options["full"] or not options["incremental"]
        result = checkpoint(full_scan=full, batch_size=max(1, options["batch_size"]))
        for run_id in result.refused:
            self.stderr.write(f"run={run_id} REFUSED: its record does not authenticate (verify_audit --run)")
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
