"""`query_metrics(query, range_minutes=None, step_seconds=None)`: a PromQL query against Prometheus.

An instant query now, or a range query over the last `range_minutes` minutes (the step defaulted and
bounded, `stepAdjusted` saying when it was raised); the evaluation times are fixed here and part of the
result. The bounded result is one citable evidence record `prom:<16 hex>` in the run's canonical store,
which the model sees in the shape `lookup_knowledge` uses. Any Prometheus failure raises the typed error
of `agent.aiops.http`, recorded as FAILED (`TOOL_ERROR`). Offered to AI Ops analyses only, and only
while Prometheus is configured and answers ready (`available`).
Details: docs/aiops.md, *`query_metrics`* and *Failures*.
"""

from __future__ import annotations

import json
import math
import time

from agent.aiops import prometheus
from agent.aiops.prometheus import POINTS_MAX, PrometheusClient, metric_evidence
from agent.runtime.tools.registry import FLOW_AI_OPS, EvidenceRecord, ToolResult, register_tool
from diagnosis.evidence import METRIC_RESULT

QUERY_MAX_CHARS = 1000
RANGE_MINUTES_MAX = 1440
STEP_SECONDS_MAX = 3600
# Prometheus refuses more than 11 000 points per series; this tool never asks for more than this.
FETCH_POINTS_MAX = 1000


def _window(range_minutes: int | None, step_seconds: int | None, now: float) -> tuple[dict[str, float], bool]:
    """`(window, step_adjusted)`: `{"time"}` or `{"start", "end", "step"}`."""
    if range_minutes is None:
        if step_seconds is not None:
            raise ValueError("step_seconds needs range_minutes (it is the step of a range query)")
        return {"time": now}, False
    seconds = range_minutes * 60
    # A range [end - seconds, end] at step s has floor(seconds / s) + 1 points (both ends count).
    step = step_seconds if step_seconds is not None else max(1, math.ceil(seconds / (POINTS_MAX - 1)))
    least = math.ceil(seconds / (FETCH_POINTS_MAX - 1))
    adjusted = step < least
    return {"start": now - seconds, "end": now, "step": float(max(step, least))}, adjusted


@register_tool(
    name="query_metrics",
    description=(
        "Run a PromQL query against the monitoring Prometheus: an instant query now, or with range_minutes "
        "a range query over the last minutes. Returns one evidence item with an id like "
        f"{METRIC_RESULT.form}; cite it as [{METRIC_RESULT.form}] for every claim the numbers support."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": QUERY_MAX_CHARS,
                "description": 'PromQL, e.g. up{job="node"} or rate(http_requests_total[5m]).',
            },
            "range_minutes": {
                "type": "integer",
                "minimum": 1,
                "maximum": RANGE_MINUTES_MAX,
                "description": "Make it a range query over the last N minutes (omit for an instant query).",
            },
            "step_seconds": {
                "type": "integer",
                "minimum": 1,
                "maximum": STEP_SECONDS_MAX,
                "description": "Resolution of a range query (default: about 60 points over the range).",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    flows=(FLOW_AI_OPS,),
    available=prometheus.unavailable,
)
def query_metrics(
    query: str, range_minutes: int | None = None, step_seconds: int | None = None
) -> ToolResult:
    client = PrometheusClient.from_settings()
    window, step_adjusted = _window(range_minutes, step_seconds, round(time.time(), 3))
    if "step" in window:
        result = client.query_range(query, start=window["start"], end=window["end"], step=window["step"])
    else:
        result = client.query(query, time=window["time"])
    evidence = metric_evidence(query=query, window=window, result=result)
    data = {**evidence, "stepAdjusted": step_adjusted}
    # The same shape as lookup_knowledge's view: evidence items with id, title, heading and text.
    model_view = {
        "query": query,
        "kind": evidence["kind"],
        "seriesTotal": evidence["seriesTotal"],
        "truncated": evidence["truncated"],
        "warnings": evidence["warnings"],
        "evidence": [
            {
                "id": evidence["id"],
                "title": evidence["title"],
                "heading": evidence["heading"],
                "text": evidence["text"],
                "resultType": evidence["resultType"],
                "result": evidence["result"],
            }
        ],
        "note": f"Cite this result as [{evidence['id']}]."
        + (" It was truncated: narrow the query to see every series." if evidence["truncated"] else ""),
    }
    return ToolResult(
        data=data,
        evidence=[EvidenceRecord(id=evidence["id"], payload=evidence)],
        model_content=json.dumps(model_view, ensure_ascii=False),
    )
