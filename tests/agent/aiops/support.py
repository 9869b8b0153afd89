"""Support for the AI Ops agent tests: a tool registry with stand-ins for the Prometheus and Alertmanager
tools (the real ones need those servers; these return the same shapes: a `prom:<hex>` evidence record
stored in the canonical store, an alert list), and a helper that creates and executes an AI_OPS run."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from agent.runtime import supervisor
from agent.runtime.llm import aclose_clients
from agent.runtime.tools.registry import EvidenceRecord, ToolRegistry, ToolResult, default_registry
from agent.runtime.worker import work
from diagnosis import services
from tests.agent.runtime.support import execute

ALERT = (
    "Alert DiskFull firing (severity critical)\n"
    "Summary: the disk is full on /var/log and writes fail with No space left on device\n"
    "Labels: instance=web-1:9100, job=node, mountpoint=/var/log\n"
    'Expression: node_filesystem_avail_bytes{mountpoint="/var/log"} < 1e6'
)
# The readable account `query_metrics` gives of a range result (`agent.aiops.prometheus.describe`).
METRIC_TEXT = (
    "matrix result range 2026-12-01T12:30:00Z .. 2026-12-01T13:00:00Z step 30s: 1 series\n"
    'node_filesystem_avail_bytes{instance="web-1:9100",mountpoint="/var/log"}: 61 samples '
    "2026-12-01T12:30:00Z .. 2026-12-01T13:00:00Z: first 2147483648, last 8388608, min 8388608, "
    "max 2147483648"
)


def metric_result(query: str) -> ToolResult:
    """What `query_metrics` returns: one citable `prom:` evidence record and the model's view of it."""
    evidence_id = "prom:" + hashlib.sha256(query.encode()).hexdigest()[:16]
    payload = {
        "id": evidence_id,
        "source": "prometheus",
        "title": "Prometheus range query",
        "heading": query,
        "text": METRIC_TEXT,
    }
    item = {key: payload[key] for key in ("id", "title", "heading", "text")}
    view = {"query": query, "evidence": [item], "note": f"Cite this result as [{evidence_id}]."}
    return ToolResult(
        data=payload,
        evidence=[EvidenceRecord(id=evidence_id, payload=payload)],
        model_content=json.dumps(view),
    )


def aiops_registry(*, metrics_fail: bool = False) -> ToolRegistry:
    """`lookup_knowledge` (the real one) plus `query_metrics` and `list_alerts` stand-ins with the real
    tools' names and arguments; `metrics_fail`: `query_metrics` raises as with Prometheus down."""
    registry = default_registry().copy()

    def query_metrics(query: str, range_minutes: int | None = None, step_seconds: int | None = None):
        if metrics_fail:
            raise ConnectionError("Prometheus at 127.0.0.1:9 refused the connection")
        return metric_result(query)

    def list_alerts(active_only: bool = True, filter: list[str] | None = None) -> dict[str, Any]:
        return {
            "alerts": [{"labels": {"alertname": "DiskFull", "instance": "web-1:9100"}, "state": "active"}]
        }

    registry.tool(
        name="query_metrics",
        description="Run a PromQL query against Prometheus.",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1},
                "range_minutes": {"type": "integer", "minimum": 1},
                "step_seconds": {"type": "integer", "minimum": 1},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    )(query_metrics)
    registry.tool(
        name="list_alerts",
        description="List the alerts Alertmanager holds.",
        parameters={
            "type": "object",
            "properties": {
                "active_only": {"type": "boolean", "default": True},
                "filter": {"type": "array", "items": {"type": "string"}},
            },
            "additionalProperties": False,
        },
    )(list_alerts)
    return registry


def run_aiops(user, alert: str = ALERT, **kwargs: Any):
    """Create an AI_OPS run of `alert` for `user` and execute it to its end."""
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query=alert, agent_flow="AI_OPS")
    outcome, sink = execute(run.run_id, **kwargs)
    run.refresh_from_db()
    return run, outcome, sink


def drain() -> None:
    """Run this process's queue worker until the queue is empty (one run at a time), then stop the
    background duties and close the model clients, as a server process would at shutdown."""

    async def main() -> None:
        try:
            await work(launch=supervisor.launch, concurrency=1, poll_interval=0.05, until_idle=True)
        finally:
            await supervisor.stop_background()
            await aclose_clients()

    asyncio.run(main())
