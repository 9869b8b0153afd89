"""Datasets of real runs, and experiments that replay them (issue 34 items 3 and 4).

`Dataset` is one version of a named dataset and `DatasetItem` one item of it (its source run's question,
reference answer, reviews and scores as they were); versions and items are append-only, written only by
`experiments.datasets` and never updated or deleted. `Experiment` is one dataset version replayed under
one candidate (`agent.runtime.candidate.Candidate`) with its configuration fingerprint; `ExperimentRun`
is one item's replay, or the error that kept it from running.
Details: docs/experiments.md.
"""

from __future__ import annotations

from django.db import models


class Dataset(models.Model):
    """One version of a named dataset (see the module docstring)."""

    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    description = models.CharField(max_length=500, blank=True, default="")
    # What made this version: `add` (runs added), `import` (a JSON Lines file), with a short note (the
    # filter used, the file's name); who made it as a username snapshot.
    origin = models.CharField(max_length=16)
    note = models.CharField(max_length=500, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    item_count = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "experiments_dataset"
        ordering = ["name", "-version"]
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="uniq_dataset_name_version")]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class DatasetItem(models.Model):
    """One item of one dataset version (see the module docstring)."""

    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="items")
    position = models.PositiveIntegerField()
    source_run_id = models.CharField(max_length=64)
    source_session_id = models.CharField(max_length=64, blank=True, default="")
    agent_flow = models.CharField(max_length=32, blank=True, default="")
    config_fingerprint = models.CharField(max_length=64, blank=True, default="")
    question = models.TextField()
    reference = models.TextField(blank=True, default="")
    release_decision = models.CharField(max_length=16, blank=True, default="")
    intent = models.CharField(max_length=16, blank=True, default="")
    # [{verdict, reviewer, note, at, sequenceNo}] and [{evaluator, version, kind, value, label, at}]
    reviews = models.JSONField(default=list, blank=True)
    scores = models.JSONField(default=list, blank=True)
    # A benchmark scenario's expected findings (`expected:` of benchmarks/incidents/<id>/scenario.yaml,
    # with its id), which the diagnosis scorers compare a replay with; {} for an item of a real run.
    expected = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "experiments_dataset_item"
        ordering = ["dataset", "position"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "position"], name="uniq_dataset_item_position"),
            models.UniqueConstraint(fields=["dataset", "source_run_id"], name="uniq_dataset_item_run"),
        ]

    def __str__(self) -> str:
        return f"{self.dataset} #{self.position}"


class ExperimentStatus(models.TextChoices):
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


class Experiment(models.Model):
    """One dataset version replayed under one candidate configuration (see the module docstring)."""

    name = models.CharField(max_length=200)
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="experiments")
    candidate = models.JSONField(default=dict)
    candidate_fingerprint = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=ExperimentStatus.choices, default=ExperimentStatus.RUNNING
    )
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "experiments_experiment"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.dataset})"


class ExperimentRun(models.Model):
    """One item's replay in an experiment: the run it made, or why it made none."""

    experiment = models.ForeignKey(Experiment, on_delete=models.PROTECT, related_name="replays")
    item = models.ForeignKey(DatasetItem, on_delete=models.PROTECT, related_name="+")
    run_id = models.CharField(max_length=64, blank=True, default="")
    error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "experiments_experiment_run"
        ordering = ["experiment", "item__position"]
        constraints = [models.UniqueConstraint(fields=["experiment", "item"], name="uniq_experiment_item")]

    def __str__(self) -> str:
        return f"{self.experiment_id}:{self.item_id}"
