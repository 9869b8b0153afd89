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
