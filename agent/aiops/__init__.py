"""The AI Ops domain: what starts an analysis, and what an analysis reads from the operations stack.

Starting analyses (the transport and the writes behind it):

- `apis`: Alertmanager's webhook (bearer token), the staff analyses endpoint and list.
- `intake`: the one way an AI Ops run is created (session, queued run, `AiOpsAlert` row; dedupe of
  Alertmanager notifications per firing). Execution is the queue worker's (`agent.runtime.worker`).

Reading the operations stack (no runtime, no models: settings and `audit.payloads` only):

- `http`: the one HTTP path to the monitoring servers (httpx, timeouts, bounded response size) and the
  typed errors every client raises (`NotConfigured`, `Unreachable`, `RequestTimeout`, `HTTPError`,
  `BadQuery`, `ResponseTooLarge`, `BadResponse`, all `AiOpsError`).
- `prometheus`: the Prometheus HTTP API client (instant and range queries), the bounding of a query
  result and the `prom:<hex>` evidence id computed over it.
- `alertmanager`: the Alertmanager API v2 client (alerts).

The agent tools that use the clients are `agent.runtime.tools.query_metrics` and
`agent.runtime.tools.list_alerts`.
"""
