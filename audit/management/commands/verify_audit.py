"""`manage.py verify_audit [--run RUN_ID]`: check sequence gaps, the hash chain and every row's digest;
exit 1 on any problem."""

from django.core.management.base import BaseCommand, CommandError

from audit.models import TraceEvent
from audit.verification import RUN_BATCH, verify_all_runs, verify_run
from diagnosis.models import DiagnosisRun


class Command(BaseCommand):
    help = (
        "Verify the stored audit of one run (--run) or of every run: timeline sequence numbers 1..n "
        "without gap, the hash chain, every step, tool, reasoning row and the run's terminal summary "
        "against the digest its chain carries, and for finished runs the stored counts against the "
        "expected ones the chain records and recorded write failures. Prints problems (never content) "
        "and notes (rows recorded before row digests, purged reasoning); exits 1 if there is a problem."
    )

    def add_arguments(self, parser):
        parser.add_argument("--run", metavar="RUN_ID", help="verify only this run")
        parser.add_argument("--batch-size", type=int, default=RUN_BATCH, help="runs read per batch")

    def handle(self, *args, **options):
        run_id = options["run"]
        if run_id:
            if not (
                DiagnosisRun.objects.filter(run_id=run_id).exists()
                or TraceEvent.objects.filter(run_id=run_id).exists()
            ):
                raise CommandError(f"no run {run_id}")
            results = iter([verify_run(run_id)])
        else:
            results = verify_all_runs(batch_size=max(1, options["batch_size"]))

        total = failed = rows = 0
        for result in results:
            total += 1
            rows += result.rows_verified
            for note in result.notes:
                self.stdout.write(f"run={result.run_id} NOTE {note}")
            if result.ok:
                continue
            failed += 1
            for problem in result.invalid:
                self.stdout.write(f"run={result.run_id} INVALID {problem}")
            for problem in result.incomplete:
                self.stdout.write(f"run={result.run_id} INCOMPLETE {problem}")
        self.stdout.write(
            f"verified {total} run(s): {total - failed} ok, {failed} with problems; {rows} row(s) verified"
        )
        if failed:
            raise CommandError(f"{failed} run(s) failed verification")
