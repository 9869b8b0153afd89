"""`manage.py verify_audit [--run RUN_ID | --all | --since CHECKPOINT] [--state FILE] [--workers N] [--json]
[--witness FILE] [--witness-key VKEY …] [--witness-quorum N] [--refresh-facts]`: check the runs' rows and
chains, their list facts and anchors, and the log; incremental from the state file when one is kept
(`AUDIT_VERIFY_STATE_PATH`). Exit 0: verified; 1: a problem; 2: the command could not run as asked.

With a witness policy the newest checkpoint must carry cosignatures of at least N of its witnesses;
without `--run`, each witness of `AUDIT_WITNESSES` is asked live which size it has cosigned, so a
rolled-back log is a problem.
Details: docs/audit-integrity.md, *Commands*, *Incremental and parallel verification*, *Witnesses*.
"""

import json
import os
import time
from functools import partial
from itertools import chain

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from audit.models import LogLeaf, TraceEvent
from audit.transparency import signednote, witnesses
from audit.transparency.checkpoints import read_witness
from audit.transparency.keys import SigningKeysMissing
from audit.transparency.verify import UNANCHORED, prove_run, verify_log
from audit.verify import incremental, parallel
from audit.verify.configurations import configuration_problems
from audit.verify.governance_chain import governance_anchors, newest_governance_anchor, verify_governance
from audit.verify.provenance import GovernanceView
from audit.verify.runs import RUN_BATCH, orphaned_run_ids, refresh_facts, verify_run
from diagnosis.models import DiagnosisRun

PROBLEM_KINDS = (" INVALID ", " INCOMPLETE ", " FACTS ")


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
        parser.add_argument(
            "--all", action="store_true", help="verify everything, whatever the state file says"
        )
        parser.add_argument(
            "--since",
            metavar="CHECKPOINT",
            help="verify what changed since this checkpoint: a tree size of a stored checkpoint, or a state "
            "file written by an earlier verification",
        )
        parser.add_argument(
            "--state",
            metavar="FILE",
            help="the state file to continue from and to write after a clean verification (default: "
            "AUDIT_VERIFY_STATE_PATH)",
        )
        parser.add_argument("--workers", type=int, default=1, help="worker processes verifying runs")
        parser.add_argument("--json", action="store_true", help="print one JSON summary instead of lines")
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

    def _write(self, line: str) -> None:
        """One output line: printed (not with --json), and kept for the JSON summary when a problem."""
        if any(kind in line for kind in PROBLEM_KINDS):
            self._problems.append(line)
        if not self._json:
            self.stdout.write(line)

    def handle(self, *args, **options):
        self._json, self._problems, self._summary = options["json"], [], {}
        started = time.perf_counter()
        try:
            failures = self._verify(options)
        finally:
            self._summary["seconds"] = round(time.perf_counter() - started, 3)
        if self._json:
            self._summary.update(ok=not failures, exitCode=1 if failures else 0, problems=self._problems)
            self.stdout.write(json.dumps(self._summary, sort_keys=True))
        if failures:
            raise CommandError("; ".join(failures))

    def _verify(self, options) -> list[str]:
        """Verify as asked; returns the failures' summaries (empty: everything verified)."""
        run_id = options["run"]
        policy = self._policy(options)
        try:
            known_witnesses = [w.verifier for w in witnesses.configured()]
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if run_id:
            return self._one_run(run_id, policy, options)
        plan = self._plan(options)
        # The watermarks of the next state are taken before anything is read: what is written during
        # this verification is new to the next one (with a state file, as its own were checked).
        workers = max(1, options["workers"])
        marks = (plan.marks or incremental.watermarks(connections_n=workers)) if plan.state_path else None
        # The governance chain (rights, holds, purges, adoption) read once for every check below.
        governance = GovernanceView.load()
        batch = max(1, options["batch_size"])
        if plan.since is None:
            chunks, total = parallel.range_chunks(batch), None
            orphans = orphaned_run_ids()
        else:
            chosen = incremental.changed_run_ids(
                plan.since, plan.watermarks, unanchored_from=plan.unanchored_from
            )
            chunks, present = parallel.id_chunks(chosen, batch)
            total = len(present)
            orphans = sorted(chosen - present)
        witness = self._witness(options)
        # With workers, the log is verified in a process of its own while the runs are.
        log_verification = parallel.in_background(
            partial(
                verify_log,
                witness=witness[0],
                policy=policy,
                witnesses=known_witnesses,
                governance=governance,
                since=plan.since,
            ),
            enabled=workers > 1,
        )
        results = chain(
            parallel.verify_chunks(chunks, workers=workers, governance=governance),
            (verify_run(o, governance=governance) for o in orphans),
        )
        failures = list(plan.problems)
        failed = self._runs(
            results, options, total=(total if total is not None else None), orphans=len(orphans)
        )
        log = self._log(log_verification(), witness, policy, plan.since)
        anchors = log.governance
        if plan.since is not None:
            anchors = governance_anchors(below=plan.since.tree_size)
            for seq, leaves in log.governance.items():
                anchors.setdefault(seq, []).extend(leaves)
        governance_problems = self._governance(log, governance, anchors)
        configuration_issues = self._configurations()
        if failed:
            failures.append(f"{failed} run(s) failed verification")
        if log.invalid:
            failures.append(f"the transparency log has {len(log.invalid)} problem(s)")
        if governance_problems:
            failures.append(f"the governance log has {len(governance_problems)} problem(s)")
        if configuration_issues:
            failures.append(f"the stored run configurations have {len(configuration_issues)} problem(s)")
        self._keep_state(plan, marks, log, failures)
        return failures

    def _one_run(self, run_id: str, policy, options) -> list[str]:
        governance = GovernanceView.load()
        if not (
            DiagnosisRun.objects.filter(run_id=run_id).exists()
            or TraceEvent.objects.filter(run_id=run_id).exists()
            or LogLeaf.objects.filter(run_id=run_id).exists()
        ):
            raise CommandError(f"no run {run_id}", returncode=2)
        self._summary["mode"] = "run"
        failed = self._runs(iter([verify_run(run_id, governance=governance)]), options, total=1)
        problems, summary = prove_run(run_id, policy)
        for problem in problems:
            self._write(f"run={run_id} INVALID {problem}")
        if summary:
            self._write(f"run={run_id} {summary}")
        failures = [f"{failed} run(s) failed verification"] if failed else []
        if problems:
            failures.append(f"the transparency log has {len(problems)} problem(s)")
        return failures

    def _plan(self, options) -> incremental.Plan:
        """Full or incremental, from what: `--all`, `--since`, the state file (a state file that does not
        verify, or a database changed under its watermarks, makes the verification a full one)."""
        state_path = options["state"] or settings.AUDIT_VERIFY_STATE_PATH
        plan = incremental.plan(
            state_path=state_path,
            since=options["since"],
            everything=options["all"] or bool(options["run"]),
            connections_n=max(1, options["workers"]),
        )
        if plan.usage_error:
            raise CommandError(plan.usage_error, returncode=2)
        for problem in plan.problems:
            self._write(f"state INVALID {problem}")
        for note in plan.notes:
            self._write(f"state NOTE {note}")
        self._summary["mode"] = "full" if plan.since is None else "incremental"
        self._summary["since"] = plan.since.tree_size if plan.since is not None else None
        return plan

    def _keep_state(self, plan: incremental.Plan, marks, log, failures: list[str]) -> None:
        """After a clean verification, the state file records its newest checkpoint, the watermarks and
        the unanchored floor (`incremental.unanchored_floor`, searched from the state's own floor after
        an incremental verification, over every run after a full one)."""
        self._summary["stateWritten"] = False
        if not plan.state_path or failures or marks is None or log.newest is None:
            return
        cp = log.newest
        start = plan.unanchored_from if plan.watermarks is not None else 0
        state = incremental.State(
            cp.body,
            cp.signature,
            marks,
            timezone.now().isoformat(),
            cp.link,
            cp.link_signature,
            incremental.unanchored_floor(marks, from_pk=start),
        )
        try:
            incremental.write_state(plan.state_path, state)
        except (OSError, SigningKeysMissing) as exc:
            self._write(f"state NOTE not written ({type(exc).__name__}): the next verification is a full one")
            return
        self._summary["stateWritten"] = True
        name = os.path.basename(plan.state_path)
        self._write(f"state: verified up to checkpoint {log.newest.tree_size}, written to {name}")

    def _runs(self, results, options, *, total: int | None = None, orphans: int = 0) -> int:
        """Each run's verdict (notes, problems) and the totals; with `--refresh-facts`, the stored list
        facts that disagree with the rule (or a cost not priced yet) rewritten. Returns the failed runs."""
        progress = Progress(
            self.stderr, (total if total is not None else DiagnosisRun.objects.count()) + orphans
        )
        total = failed = rows = unanchored = 0
        stale: list = []
        unpriced: list = []
        for result in results:
            total += 1
            progress.tick(total)
            if result.unpriced:
                unpriced.append(result)
            rows += result.rows_verified
            unanchored += result.unanchored
            for note in result.notes:
                self._write(f"run={result.run_id} NOTE {note}")
            if result.unanchored and (options["run"] or options["verbosity"] > 1):
                self._write(f"run={result.run_id} NOTE {UNANCHORED}")
            if result.ok:
                continue
            failed += 1
            for problem in result.invalid:
                self._write(f"run={result.run_id} INVALID {problem}")
            for problem in result.incomplete:
                self._write(f"run={result.run_id} INCOMPLETE {problem}")
            for problem in result.facts:
                self._write(f"run={result.run_id} FACTS {problem}")
            if result.facts:
                stale.append(result)
        self._write(
            f"verified {total} run(s): {total - failed} ok, {failed} with problems; {rows} row(s) verified; "
            f"{unanchored} finished run(s) not yet anchored"
        )
        progress.done()
        self._summary["runs"] = {
            "verified": total,
            "ok": total - failed,
            "failed": failed,
            "rows": rows,
            "unanchored": unanchored,
            "perSecond": round(progress.rate(total), 1),
        }
        if unpriced:
            self._write(f"{len(unpriced)} finished run(s) whose cost is not priced yet")
        if stale:
            self._write(f"{len(stale)} run(s) with stored list facts that disagree with the rule")
        if options.get("refresh_facts") and (stale or unpriced):
            self._write(f"rewrote the stored list facts of {refresh_facts(stale + unpriced)} run(s)")
        return failed

    def _witness(self, options) -> tuple[list, str | None]:
        """The witness file's checkpoints, and the problem of a configured one that cannot be read."""
        witness_path = options["witness"] or settings.AUDIT_WITNESS_PATH
        try:
            return (read_witness(witness_path) if witness_path else []), None
        except OSError as exc:
            if options["witness"]:
                raise CommandError(f"cannot read the witness file: {type(exc).__name__}") from exc
            # Fail closed: a configured witness that cannot be read proves nothing was witnessed,
            # and a deleted witness file is what an attacker cutting the log back would want.
            problem = f"the configured witness file (AUDIT_WITNESS_PATH) cannot be read: {type(exc).__name__}"
            return [], problem

    def _log(self, log, witness_read, policy, since=None):
        """The log's verification (`verify_log`) against the witness file (`witness_read`: `_witness`),
        the witness policy and the witnesses' live answers; its problems and a one-line summary are
        written. Returns it."""
        witness, witness_problem = witness_read
        if witness_problem and log.checkpoints:
            log.invalid.insert(0, witness_problem)
        # The witnesses' live answers, never the stored attempts or cosignatures (a database writer's).
        sizes = witnesses.check_sizes(log.newest, policy)
        log.invalid.extend(sizes.problems)
        for problem in log.invalid:
            self._write(f"log INVALID {problem}")
        for note in sizes.notes:
            self._write(f"log NOTE {note}")
        cp = log.newest
        newest = (
            f"newest checkpoint {cp.tree_size} signed {cp.signed_at.isoformat()} key {cp.key_id}"
            if cp
            else "no checkpoint"
        )
        witnessed = f"; {len(witness)} witnessed checkpoint(s)" if witness else ""
        if since is not None:
            witnessed += f"; from checkpoint {since.tree_size} on (consistency proven)"
        self._summary["log"] = {
            "leaves": log.leaves,
            "checkpoints": log.checkpoints,
            "newest": cp.tree_size if cp else None,
            "problems": len(log.invalid),
        }
        if log.purged:
            witnessed += f"; {log.purged} anchored run(s) purged by retention (tombstones)"
        if policy is not None:
            witnessed += f"; witness policy {policy.describe()}, {policy.quorum} required"
        if sizes.asked:
            witnessed += f"; {sizes.asked} witness(es) asked for their size, {sizes.at_size} at the log's"
        self._write(
            f"verified the log: {log.leaves} leaf(s), {log.checkpoints} checkpoint(s), {newest}"
            f"{witnessed}: " + ("ok" if log.ok else f"{len(log.invalid)} problem(s)")
        )
        return log

    def _governance(self, log, governance, anchors) -> list[str]:
        """The governance chain against the heads the log anchors; returns its problems."""
        governance_events, governance_problems = verify_governance(anchors=anchors, governance=governance)
        for problem in governance_problems:
            self._write(f"governance INVALID {problem}")
        anchored = newest_governance_anchor(anchors)
        self._write(
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
            self._write(f"configurations INVALID {problem}")
        self._write(
            f"verified {configurations} stored run configuration(s): "
            + ("ok" if not configuration_issues else f"{len(configuration_issues)} problem(s)")
        )
        return configuration_issues


class Progress:
    """A progress line on stderr when it is a terminal (runs done, runs/s, ETA), at most twice a second."""

    def __init__(self, stream, total: int) -> None:
        self.stream, self.total = stream, max(total, 0)
        self.started = self.shown = time.perf_counter()
        isatty = getattr(stream, "isatty", None)
        self.on = bool(isatty and isatty()) and not os.environ.get("CI")

    def rate(self, done: int) -> float:
        elapsed = time.perf_counter() - self.started
        return done / elapsed if elapsed > 0 else 0.0

    def tick(self, done: int) -> None:
        if not self.on:
            return
        now = time.perf_counter()
        if now - self.shown < 0.5 and done != self.total:
            return
        self.shown = now
        rate = self.rate(done)
        left = max(self.total - done, 0)
        eta = f"{left / rate:,.0f} s" if rate > 0 else "?"
        width = 30
        filled = int(width * done / self.total) if self.total else width
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done:,}/{self.total:,} runs  {rate:,.0f} runs/s  "
            f"ETA {eta}   ",
            ending="",
        )
        self.stream.flush()

    def done(self) -> None:
        if self.on:
            self.stream.write("\r" + " " * 79 + "\r", ending="")
            self.stream.flush()
