"""`manage.py export_dataset NAME [--dataset-version N] [--output FILE]`: the version's items as JSON Lines
(`experiments.datasets.item_json`), to FILE or standard output; the newest version by default."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from experiments.datasets import export_jsonl
from experiments.models import Dataset


class Command(BaseCommand):
    help = "Export a dataset version as JSON Lines."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--dataset-version", type=int, dest="dataset_version")
        parser.add_argument("--output", "-o")

    def handle(self, *args, **options):
        versions = Dataset.objects.filter(name=options["name"]).order_by("-version")
        if options["dataset_version"]:
            versions = versions.filter(version=options["dataset_version"])
        dataset = versions.first()
        if dataset is None:
            raise CommandError("no such dataset version")
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8") as out:
                out.writelines(export_jsonl(dataset))
            self.stderr.write(f"{dataset}: {dataset.item_count} items written to {options['output']}")
        else:
            for line in export_jsonl(dataset):
                self.stdout.write(line, ending="")
