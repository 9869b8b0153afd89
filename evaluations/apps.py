from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    """Online evaluators (issue 34 item 2): evaluators configured in the admin score finished runs off
    the run's path (the background duty of every serving process, `evaluations.duty`, or
    `run_evaluations`), each score chained into the run's record as
    `EVALUATION_RECORDED` with its row bound (`evaluations.recording`), exported to OpenTelemetry and
    Prometheus, and shown on the run page, the run list and the dashboard."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "evaluations"
    verbose_name = "Evaluations"

    def ready(self) -> None:
        from evaluations import duty, metrics, queue, recording

        duty.register()
        recording.register()
        metrics.register()
        queue.register()
