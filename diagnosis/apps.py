from django.apps import AppConfig


class DiagnosisConfig(AppConfig):
    """Identity of the work, the bottom layer: chat sessions, runs, feedback, their selectors and services.

    The agent that executes runs is `agent`; the screens, APIs and commands over it are `surfaces`."""

    name = "diagnosis"
    verbose_name = "Diagnosis"
