"""`manage.py run_benchmark [--scenarios id,…] [--repeat N] [--config CANDIDATE] [--prometheus-url URL]
[--alertmanager-url URL] [--judge] [--judge-model M] [--against EXPERIMENT] [--user U] [--markdown]`:
run the incident scenarios (benchmarks/incidents/) through the real runtime against the configured
provider, each with its world in a real Prometheus and Alertmanager, as an experiment scored by the
diagnosis scorers; print the per-scenario table (and, with --against, the comparison with an earlier
run of the same scenarios). Details: docs/benchmark.md."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from agent.runtime.candidate import Candidate, CandidateError
from experiments.benchmark import scenarios
from experiments.benchmark.report import markdown, table
from experiments.benchmark.runner import run_benchmark
from experiments.benchmark.world import WorldError
from experiments.management.commands._acting import acting_user
from experiments.models import Experiment
from experiments.results import experiment_results


class Command(BaseCommand):
    help = "Run the incident benchmark and print each scenario's diagnosis scores."

    def add_arguments(self, parser):
        parser.add_argument("--scenarios", default="", help="comma-separated ids (default: all)")
        parser.add_argument("--repeat", type=int, default=1)
        parser.add_argument("--config", default="", help="a candidate configuration (JSON or TOML)")
        parser.add_argument("--name", default="")
        parser.add_argument("--prometheus-url", default="", dest="prometheus_url")
        parser.add_argument("--alertmanager-url", default="", dest="alertmanager_url")
        parser.add_argument("--judge", action="store_true", help="also score with the LLM judge")
        parser.add_argument("--judge-model", default=None, dest="judge_model")
        parser.add_argument("--against", type=int, default=None, help="an earlier benchmark experiment id")
        parser.add_argument("--user", default="")
        parser.add_argument("--markdown", action="store_true")

    def handle(self, *args, **options):
        ids = [i.strip() for i in options["scenarios"].split(",") if i.strip()]
        user = acting_user(options["user"])
        judge = (
            options["judge_model"]
            if options["judge_model"] is not None
            else ("" if options["judge"] else None)
        )
        try:
            chosen = scenarios.load_all(ids or None)
            candidate = Candidate.load(options["config"]) if options["config"] else None
            experiment = run_benchmark(
                chosen=chosen,
                user=user,
                repeat=options["repeat"],
                candidate=candidate,
                name=options["name"],
                prometheus_url=options["prometheus_url"],
                alertmanager_url=options["alertmanager_url"],
                judge_model=judge,
            )
        except (scenarios.ScenarioError, CandidateError, WorldError) as exc:
            raise CommandError(str(exc)) from None
        header, rows, demo = table(experiment)
        self.stdout.write(
            f"experiment {experiment.pk} on {experiment.dataset}: {len(chosen)} scenario(s) × "
            f"{max(1, options['repeat'])}" + (" — DEMO model (offline), not a real provider" if demo else "")
        )
        if options["markdown"]:
            self.stdout.write(markdown(header, rows))
        else:
            widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
            for row in [header, *rows]:
                self.stdout.write("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if options["against"] is not None:
            self._compare(experiment, options["against"])

    def _compare(self, experiment: Experiment, against_id: int) -> None:
        against = Experiment.objects.filter(pk=against_id).first()
        if against is None:
            raise CommandError("no such experiment to compare with")
        try:
            results = experiment_results(experiment, against=against)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"against experiment {against.pk}: {results.regressions} item(s) regressed")
        for s in results.evaluators:
            ci = f" [{s.ci[0]:+.3f}, {s.ci[1]:+.3f}]" if s.ci else ""
            delta = "—" if s.mean_delta is None else f"{s.mean_delta:+.3f}"
            self.stdout.write(
                f"  {s.name}: mean delta {delta}{ci} over {s.n} items ({s.worse} worse, {s.better} better)"
            )
