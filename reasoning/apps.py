from django.apps import AppConfig


class ReasoningConfig(AppConfig):
    """The separately governed store of provider reasoning text and who read it."""

    name = "reasoning"
    verbose_name = "Reasoning"

    def ready(self) -> None:
        from reasoning import checks  # noqa: F401  (registers checks)
