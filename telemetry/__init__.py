"""OpenTelemetry export of finished runs (a projection of the durable record) and service metrics."""
