from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The durable decision record: timeline events, model steps and tool invocations."""

    name = "audit"
    verbose_name = "Audit"
