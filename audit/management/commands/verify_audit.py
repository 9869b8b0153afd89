"""`manage.py verify_audit [--run RUN_ID] [--witness FILE] [--witness-key VKEY …] [--witness-quorum N]
[--refresh-facts]`: check every run's rows and chain, its stored list facts, its anchor in the
transparency log, and the log itself; exit 1 on any problem (a disagreeing fact rewritten by
`--refresh-facts` is still reported, and still fails).

With a witness policy the newest checkpoint must carry cosignatures of at least N of its witnesses;
without `--run`, each witness of `AUDIT_WITNESSES` is asked live which size it has cosigned, so a
rolled-back log is a problem.
Details: docs/audit-integrity.md, *Commands* and *Witnesses* (witness policy, rollback).
"""

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from audit.models import LogLeaf, TraceEvent
from audit.transparency import signednote, witnesses
from audit.transparency.checkpoints import read_witness
from audit.transparency.verify import UNANCHORED, prove_run, verify_log
from audit.verify.configurations import configuration_problems
from audit.verify.governance_chain import newest_governance_anchor, verify_governance
from audit.verify.provenance import GovernanceView
from audit.verify.runs import RUN_BATCH, refresh_facts, verify_all_runs, verify_run
from diagnosis.models import DiagnosisRun


class Command(BaseCommand):
    help = (
        "Verify the stored audit of one run (--run) or of every run: timeline sequence numbers 1..n "
        "without gap, the hash chain, every step, tool, reasoning row and the run's terminal summary "
        "against the digest its chain carries, for finished runs the stored counts against the expected "
        "ones the chain records and recorded write failures, and each anchored run's chain head against "
        "its leaf in the transparency log, and each run's stored list facts (persisted counts, audit "
        "complete, cost) against the rule recomputed (--refresh-facts rewrites those that disagree). "
        "Without --run, also the whole log: every leaf and stored "
        "node, every checkpoint's signature and its chain, every checkpoint's root against the stored "
        "leaves, no leaf missing or unsigned, no anchored run deleted, and the checkpoints of a witness "
        "file (--witness, default AUDIT_WITNESS_PATH), and the governance chain of access changes with "
        "its anchors in the log, and each witness of AUDIT_WITNESSES asked for the size it has cosigned (a "
        "log rolled back below it is a problem). "
        "With --run, the run's inclusion proof in the "
        "newest checkpoint. Prints problems (never content) and notes (rows recorded before row digests, "
        "purged reasoning; finished runs not yet anchored are counted, and listed with -v 2); exits 1 if "
        "there is a problem."
    )

    def add_arguments(self, parser):
        parser.add_argument("--run", metavar="RUN_ID", help="verify only this run, with its inclusion proof")
        parser.add_argument("--batch-size", type=int, default=RUN_BATCH, help="runs read per batch")
        parser.add_argument(
            "--witness",
            metavar="FILE",
            help="a witness file of checkpoints kept outside the database (default: AUDIT_WITNESS_PATH)",
        )
        parser.add_argument(
            "--witness-key",
            action="append",
            metavar="VKEY",
            help="a witness's cosigner vkey the newest checkpoint must be cosigned by (repeatable; default "
            "AUDIT_WITNESS_POLICY)",
        )
        parser.add_argument(
            "--witness-quorum",
            type=int,
            metavar="N",
            help="how many of the witness keys must have cosigned (default AUDIT_WITNESS_QUORUM; 0: all)",
        )
        parser.add_argument(
            "--refresh-facts",
            action="store_true",
            help="rewrite the stored list facts that disagree with the rule (reported all the same)",
        )

    def _policy(self, options) -> signednote.Policy | None:
        try:
            if not options["witness_key"] and not options["witness_quorum"]:
                return witnesses.policy()
            vkeys = options["witness_key"] or list(settings.AUDIT_WITNESS_POLICY)
            policy = signednote.make_policy(vkeys, options["witness_quorum"] or None)
        except (signednote.SignedNoteError, ImproperlyConfigured) as exc:
            raise CommandError(f"bad witness policy: {exc}") from exc
        if policy is None:
            raise CommandError("--witness-quorum needs witness keys (--witness-key or AUDIT_WITNESS_POLICY)")
        return policy

    def handle(self, *args, **options):
        run_id = options["run"]
        policy = self._policy(options)
        try:
            known_witnesses = [w.verifier for w in witnesses.configured()]
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        # The governance chain (rights, holds, purges, adoption) read once for every check below.
        governance = GovernanceView.load()
        if run_id:
            if not (
                DiagnosisRun.objects.filter(run_id=run_id).exists()
                or TraceEvent.objects.filter(run_id=run_id).exists()
                or LogLeaf.objects.filter(run_id=run_id).exists()
            ):
                raise CommandError(f"no run {run_id}")
            results = iter([verify_run(run_id, governance=governance)])
        else:
            results = verify_all_runs(batch_size=max(1, options["batch_size"]), governance=governance)
        failed = self._runs(results, options)
        if run_id:
            problems, summary = prove_run(run_id, policy)
            for problem in problems:
                self.stdout.write(f"run={run_id} INVALID {problem}")
            if summary:
                self.stdout.write(f"run={run_id} {summary}")
            log_problems = len(problems)
            failed = failed or bool(problems)
            governance_problems, configuration_issues = [], []
        else:
            log = self._log(options, policy, known_witnesses, governance)
            log_problems = len(log.invalid)
            governance_problems = self._governance(log, governance)
            configuration_issues = self._configurations()
        if failed or log_problems or governance_problems or configuration_issues:
            parts = []
            if failed:
                parts.append(f"{failed} run(s) failed verification")
            if log_problems:
                parts.append(f"the transparency log has {log_problems} problem(s)")
            if governance_problems:
                parts.append(f"the governance log has {len(governance_problems)} problem(s)")
            if configuration_issues:
                parts.append(f"the stored run configurations have {len(configuration_issues)} problem(s)")
            raise CommandError("; ".join(parts))

    def _runs(self, results, options) -> int:
        """Each run's verdict (notes, problems) and the totals; with `--refresh-facts`, the stored list
        facts that disagree with the rule (or a cost not priced yet) rewritten. Returns the failed runs."""
        total = failed = rows = unanchored = 0
        stale: list = []
        unpriced: list = []
        for result in results:
            total += 1
            if result.unpriced:
                unpriced.append(result)
            rows += result.rows_verified
            unanchored += result.unanchored
            for note in result.notes:
                self.stdout.write(f"run={result.run_id} NOTE {note}")
            if result.unanchored and (options["run"] or options["verbosity"] > 1):
                self.stdout.write(f"run={result.run_id} NOTE {UNANCHORED}")
            if result.ok:
                continue
            failed += 1
            for problem in result.invalid:
                self.stdout.write(f"run={result.run_id} INVALID {problem}")
            for problem in result.incomplete:
                self.stdout.write(f"run={result.run_id} INCOMPLETE {problem}")
            for problem in result.facts:
                self.stdout.write(f"run={result.run_id} FACTS {problem}")
            if result.facts:
                stale.append(result)
        self.stdout.write(
            f"verified {total} run(s): {total - failed} ok, {failed} with problems; {rows} row(s) verified; "
            f"{unanchored} finished run(s) not yet anchored"
        )
        if unpriced:
            self.stdout.write(f"{len(unpriced)} finished run(s) whose cost is not priced yet")
        if stale:
            self.stdout.write(f"{len(stale)} run(s) with stored list facts that disagree with the rule")
        if options["refresh_facts"] and (stale or unpriced):
            self.stdout.write(f"rewrote the stored list facts of {refresh_facts(stale + unpriced)} run(s)")
        return failed

    def _log(self, options, policy, known_witnesses, governance):
        """The transparency log against the witness file, the witness policy and the witnesses' live
        answers; its problems and a one-line summary are written. Returns the log's verification."""
        witness_path = options["witness"] or settings.AUDIT_WITNESS_PATH
        witness, witness_problem = [], None
        try:
            witness = read_witness(witness_path) if witness_path else []
        except OSError as exc:
            if options["witness"]:
                raise CommandError(f"cannot read the witness file: {type(exc).__name__}") from exc
            # Fail closed: a configured witness that cannot be read proves nothing was witnessed,
            # and a deleted witness file is what an attacker cutting the log back would want.
            witness_problem = (
                f"the configured witness file (AUDIT_WITNESS_PATH) cannot be read: {type(exc).__name__}"
            )
        log = verify_log(witness=witness, policy=policy, witnesses=known_witnesses, governance=governance)
        if witness_problem and log.checkpoints:
            log.invalid.insert(0, witness_problem)
        # The witnesses' live answers, never the stored attempts or cosignatures (a database writer's).
        sizes = witnesses.check_sizes(log.newest, policy)
        log.invalid.extend(sizes.problems)
        for problem in log.invalid:
            self.stdout.write(f"log INVALID {problem}")
        for note in sizes.notes:
            self.stdout.write(f"log NOTE {note}")
        cp = log.newest
        newest = (
            f"newest checkpoint {cp.tree_size} signed {cp.signed_at.isoformat()} key {cp.key_id}"
            if cp
            else "no checkpoint"
        )
        witnessed = f"; {len(witness)} witnessed checkpoint(s)" if witness else ""
        if log.purged:
            witnessed += f"; {log.purged} anchored run(s) purged by retention (tombstones)"
        if policy is not None:
            witnessed += f"; witness policy {policy.describe()}, {policy.quorum} required"
        if sizes.asked:
            witnessed += f"; {sizes.asked} witness(es) asked for their size, {sizes.at_size} at the log's"
        self.stdout.write(
            f"verified the log: {log.leaves} leaf(s), {log.checkpoints} checkpoint(s), {newest}"
            f"{witnessed}: " + ("ok" if log.ok else f"{len(log.invalid)} problem(s)")
        )
        return log

    def _governance(self, log, governance) -> list[str]:
        """The governance chain against the heads the log anchors; returns its problems."""
        governance_events, governance_problems = verify_governance(
            anchors=log.governance, governance=governance
        )
        for problem in governance_problems:
            self.stdout.write(f"governance INVALID {problem}")
        anchored = newest_governance_anchor(log.governance)
        self.stdout.write(
            f"verified the governance log: {governance_events} event(s), anchored in the transparency "
            f"log up to event {anchored}"
            + (
                f" ({governance_events - anchored} newer, anchored by the next checkpoint)"
                if governance_events > anchored
                else ""
            )
            + ": "
            + ("ok" if not governance_problems else f"{len(governance_problems)} problem(s)")
        )
        return governance_problems

    def _configurations(self) -> list[str]:
        """The stored run configurations against their fingerprints; returns their problems."""
        configurations, configuration_issues = configuration_problems()
        for problem in configuration_issues:
            self.stdout.write(f"configurations INVALID {problem}")
        self.stdout.write(
            f"verified {configurations} stored run configuration(s): "
            + ("ok" if not configuration_issues else f"{len(configuration_issues)} problem(s)")
        )
        return configuration_issues
