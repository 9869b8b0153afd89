from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The durable decision record: timeline events, model steps, tool invocations and the transparency
    log over finished runs."""

    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from audit import review_reasons
        from audit.transparency import checks  # noqa: F401  (registers checks)

        review_reasons.register()
