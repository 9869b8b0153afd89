"""The AI Ops domain: what an AI Ops analysis reads from the operations stack.

- `http`: the one HTTP path to the monitoring servers (httpx, timeouts, bounded response size) and the
  typed errors every client raises (`NotConfigured`, `Unreachable`, `RequestTimeout`, `HTTPError`,
  `BadQuery`, `ResponseTooLarge`, `BadResponse`, all `AiOpsError`).
- `prometheus`: the Prometheus HTTP API client (instant and range queries), the bounding of a query
  result and the `prom:<hex>` evidence id computed over it.
- `alertmanager`: the Alertmanager API v2 client (alerts).

These modules stand on settings and `audit.payloads` alone (no runtime, no models); the agent tools that
use them are `diagnosis.runtime.tools.query_metrics` and `diagnosis.runtime.tools.list_alerts`.
"""
