from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    """Datasets built from real runs and experiments that replay them (issue 34 items 3 and 4): a dataset
    is a versioned, append-only set of items (a source run's question, its released answer as the
    reference, its reviews and scores as they were); an experiment replays every item of one version
    through the real runtime under a candidate configuration, each replay a recorded, verifiable run
    marked as an experiment run, scored by the same evaluators and compared with its source run."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "experiments"
    verbose_name = "Datasets and experiments"

    def ready(self) -> None:
        from audit.verify import coverage
        from evaluations.diagnosis import register_expectations
        from experiments.scoring import expected_of

        register_expectations(expected_of)
        from experiments.models import Dataset, DatasetItem, Experiment, ExperimentRun

        coverage.not_audited(
            {
                Dataset: (
                    "a named list of questions an experimenter keeps, versioned (a new version per change): "
                    "evidence of no run"
                ),
                DatasetItem: (
                    "a snapshot of a source run taken for replay: what each replay was asked is bound by its "
                    "run's run-start digest, and the results read scores from the chained score rows (the "
                    "item's kept copy only for a source run purged since)"
                ),
                Experiment: (
                    "what an experimenter asked to replay, under which candidate configuration: each replay "
                    "run chains that configuration and its purpose (experiment) in its RUN_STARTED"
                ),
                ExperimentRun: (
                    "which replay run answered which item: the replay is a run like any other, chained and "
                    "anchored; a wrong link shows another run's verified record, never an unverified one"
                ),
            }
        )
