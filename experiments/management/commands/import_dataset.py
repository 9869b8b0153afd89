"""`manage.py import_dataset NAME FILE`: a new version of dataset NAME with the items of the JSON Lines
FILE (`experiments.datasets.import_jsonl`: items whose source run the dataset holds are skipped)."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from experiments.datasets import DatasetError, import_jsonl


class Command(BaseCommand):
    help = "Import JSON Lines into a new version of a dataset."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("file")

    def handle(self, *args, **options):
        path = Path(options["file"])
        try:
            with path.open(encoding="utf-8") as lines:
                dataset = import_jsonl(name=options["name"], lines=lines, by="manage.py", note=path.name)
        except (DatasetError, OSError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{dataset.name} v{dataset.version}: {dataset.item_count} items")
