from django.apps import AppConfig


class DiagnosisConfig(AppConfig):
    """Identity of the work: chat sessions, runs, feedback, and the agent runtime that executes runs."""

    name = "diagnosis"
    verbose_name = "Diagnosis"

    def ready(self) -> None:
        from diagnosis import checks, signals  # noqa: F401  (registers the system checks, the approvers group)
        from diagnosis.runtime import approvals  # noqa: F401  (erases saved resume states on reasoning purges)
