from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Export of finished runs as OpenTelemetry GenAI traces (outbox, exporter duty) and `/metrics`."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "telemetry"
    verbose_name = "Telemetry"

    def ready(self) -> None:
        from telemetry.loop_lag import monitor
        from telemetry.metrics import register_process_collector

        register_process_collector(monitor)  # this process's event-loop lag (LOOP_LAG_SAMPLE_MS)
