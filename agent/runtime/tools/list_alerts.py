"""`list_alerts(active_only=True, filter=[])`: the alerts Alertmanager holds (API v2).

`filter` are label matchers that must all match; `active_only` leaves out silenced and inhibited alerts.
The list, bounded by `agent.aiops.alertmanager.bound_alerts`, is the tool's canonical data and what the
model sees. Alerts are context, not citable evidence. Any Alertmanager failure raises the typed error of
`agent.aiops.http`, recorded as FAILED. Offered to AI Ops analyses only, and only while Alertmanager
is configured and answers ready (`available`).
Details: docs/aiops.md, *`list_alerts`*.
"""

from __future__ import annotations

import json

from agent.aiops import alertmanager
from agent.aiops.alertmanager import AlertmanagerClient, bound_alerts
from agent.runtime.tools.registry import FLOW_AI_OPS, ToolResult, register_tool

FILTERS_MAX = 10
MATCHER_MAX_CHARS = 200


@register_tool(
    name="list_alerts",
    description=(
        "List the alerts currently held by Alertmanager (active ones by default), optionally filtered by "
        'label matchers like alertname="HighLatency". Use it to see what is firing and its labels; cite '
        "metric results or runbooks, not alerts, as evidence."
    ),
    parameters={
        "type": "object",
        "properties": {
            "active_only": {
                "type": "boolean",
                "default": True,
                "description": "Only active alerts (not silenced or inhibited).",
            },
            "filter": {
                "type": "array",
                "maxItems": FILTERS_MAX,
                "items": {"type": "string", "minLength": 1, "maxLength": MATCHER_MAX_CHARS},
                "default": [],
                "description": 'Label matchers that must all match, e.g. ["alertname=\\"HighLatency\\""].',
            },
        },
        "additionalProperties": False,
    },
    flows=(FLOW_AI_OPS,),
    available=alertmanager.unavailable,
)
def list_alerts(active_only: bool = True, filter: list[str] | None = None) -> ToolResult:
    client = AlertmanagerClient.from_settings()
    matchers = list(filter or [])
    alerts, facts = bound_alerts(client.alerts(active_only=active_only, filters=matchers))
    data = {"activeOnly": active_only, "filter": matchers, **facts, "alerts": alerts}
    return ToolResult(data=data, model_content=json.dumps(data, ensure_ascii=False))
