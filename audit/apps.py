from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The durable decision record: timeline events, model steps and tool invocations."""

    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from audit import signals  # noqa: F401  (connects post_migrate: the "Staff viewers" group)
