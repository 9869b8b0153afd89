"""`manage.py run_experiment DATASET --config CANDIDATE [--dataset-version N] [--name N] [--user U]`:
replay every item of a dataset version (the newest by default) through the real runtime under the
candidate configuration CANDIDATE (a JSON or TOML file: `agent.runtime.candidate`), score both sides
with the enabled evaluators and print the comparison's aggregate (`experiments.results`). The replays'
sessions belong to USERNAME (default: the first superuser)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from agent.runtime.candidate import Candidate, CandidateError
from experiments.management.commands._acting import acting_user
from experiments.models import Dataset
from experiments.results import experiment_results
from experiments.runner import run_experiment


class Command(BaseCommand):
    help = "Replay a dataset under a candidate configuration and compare it with its source runs."

    def add_arguments(self, parser):
        parser.add_argument("dataset")
        parser.add_argument("--config", required=True, help="the candidate (JSON or TOML)")
        parser.add_argument("--dataset-version", type=int, dest="dataset_version")
        parser.add_argument("--name", default="")
        parser.add_argument("--user", default="")

    def handle(self, *args, **options):
        versions = Dataset.objects.filter(name=options["dataset"]).order_by("-version")
        if options["dataset_version"]:
            versions = versions.filter(version=options["dataset_version"])
        dataset = versions.first()
        if dataset is None:
            raise CommandError("no such dataset version")
        user = acting_user(options["user"])
        try:
            candidate = Candidate.load(options["config"])
            experiment = run_experiment(dataset=dataset, candidate=candidate, user=user, name=options["name"])
        except CandidateError as exc:
            raise CommandError(str(exc)) from None
        results = experiment_results(experiment)
        self.stdout.write(
            f"experiment {experiment.pk} on {dataset}: {results.totals['items']} items, "
            f"{results.regressions} regressions; candidate configuration "
            f"{experiment.candidate_fingerprint[:12]}"
        )
        for s in results.evaluators:
            ci = f" [{s.ci[0]:+.3f}, {s.ci[1]:+.3f}]" if s.ci else ""
            delta = "—" if s.mean_delta is None else f"{s.mean_delta:+.3f}"
            self.stdout.write(
                f"  {s.name}: mean delta {delta}{ci} over {s.n} items ({s.worse} worse, {s.better} better)"
            )
        for key in ("baseline", "candidate"):
            t = results.totals[key]
            self.stdout.write(f"  {key}: {t['published']} published, {t['blocked']} blocked")
