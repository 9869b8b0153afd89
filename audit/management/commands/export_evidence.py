"""`manage.py export_evidence RUN_ID [--output FILE]`: write a run's evidence bundle (JSON), and say on
standard error what the server's verification of the same rows finds (`audit.verify.run_check`)."""

import json

from django.core.management.base import BaseCommand, CommandError

from audit.transparency.evidence import build_evidence
from diagnosis.models import DiagnosisRun


class Command(BaseCommand):
    help = (
        "Write the evidence bundle of one run: its hash chain, the canonical form and digest of every "
        "step, tool row and its terminal summary, the digests of its reasoning rows (never their content), "
        "its leaf, its inclusion proof in the newest checkpoint and that checkpoint's signature. Check it "
        "anywhere with `python -m audit.verify_bundle FILE --public-key KEY`."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", metavar="RUN_ID")
        parser.add_argument("--output", "-o", metavar="FILE", help="write here instead of standard output")

    def handle(self, *args, **options):
        run = DiagnosisRun.objects.filter(run_id=options["run_id"]).first()
        if run is None:
            raise CommandError(f"no run {options['run_id']}")
        evidence = build_evidence(run=run)
        body = evidence.bundle
        text = json.dumps(body, indent=1, ensure_ascii=False) + "\n"
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8") as handle:
                handle.write(text)
            anchored = "anchored" if body["anchor"] else "NOT anchored yet (run audit_checkpoint)"
            self.stderr.write(f"wrote {options['output']}: {len(body['events'])} event(s), {anchored}")
        else:
            self.stdout.write(text, ending="")
        # The server's verification of the rows the bundle carries, in verify_audit's words: what the
        # offline verifier will find, said before the file leaves.
        verdict = evidence.verification
        for problem in verdict.invalid:
            self.stderr.write(f"run={run.run_id} INVALID {problem}")
        for problem in verdict.incomplete:
            self.stderr.write(f"run={run.run_id} INCOMPLETE {problem}")
        if not verdict.invalid and not verdict.incomplete:
            rows = verdict.rows_verified
            self.stderr.write(f"run={run.run_id}: the server verifies its record ({rows} row(s) verified)")
