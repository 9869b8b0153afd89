from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Export of finished runs as OpenTelemetry GenAI traces (outbox, exporter duty) and `/metrics`."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "telemetry"
    verbose_name = "Telemetry"
