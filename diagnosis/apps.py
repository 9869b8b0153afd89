from django.apps import AppConfig


class DiagnosisConfig(AppConfig):
    """Identity of the work: chat sessions, runs, feedback, and the agent runtime that executes runs."""

    name = "diagnosis"
    verbose_name = "Diagnosis"
