"""The AI Ops domain: what starts an analysis, and what an analysis reads from the operations stack.

Starting analyses: `apis` (Alertmanager's webhook, the staff analyses endpoint and list) and `intake`
(the one way an AI Ops run is created; execution is the queue worker's). Reading the operations stack,
with no runtime and no models: `http` (the one HTTP path to the monitoring servers and its typed
errors), `prometheus` (queries, bounded results and their `prom:<hex>` ids) and `alertmanager` (API v2).
The agent tools that use the clients are `agent.runtime.tools.query_metrics` and `list_alerts`.
Details: docs/aiops.md.
"""
