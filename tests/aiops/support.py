"""Support for the AI Ops agent tests: a tool registry with stand-ins for the Prometheus and Alertmanager
tools (the real ones need those servers; these return the same shapes: a `prom:<hex>` evidence record
stored in the canonical store, an alert list), and a helper that creates and executes an AI_OPS run."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from diagnosis import services
from diagnosis.runtime.tools.registry import EvidenceRecord, ToolRegistry, ToolResult, default_registry
from tests.runtime.support import execute

ALERT = (
    "Alert DiskFull firing (severity critical)\n"
    "Summary: the disk is full on /var/log and writes fail with No space left on device\n"
    "Labels: instance=web-1:9100, job=node, mountpoint=/var/log\n"
    'Expression: node_filesystem_avail_bytes{mountpoint="/var/log"} < 1e6'
)
METRIC_TEXT = (
    "The filesystem on /var/log of web-1 has 0.4 percent of its space available. "
    "Available bytes on /var/log fell from 2 GiB to 8 MiB within the last 30 minutes."
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
    view = {
        "evidenceId": evidence_id,
        "query": query,
        "text": METRIC_TEXT,
        "note": f"Cite as [{evidence_id}].",
    }
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

    def list_alerts(filter: list[str] | None = None) -> dict[str, Any]:
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
            "properties": {"filter": {"type": "array", "items": {"type": "string"}}},
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
