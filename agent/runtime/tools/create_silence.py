"""`create_silence(matchers, duration_minutes, comment)`: an Alertmanager API v2 silence — a tool that
changes the monitored system, so it **requires approval** (`requires_approval=True`).

It never runs when the executor calls it: only after a person with `diagnosis.approve_tool_call`
approved exactly these arguments does a resumed run execute it, under the same `tool_call_id`; a
rejected or expired request never reaches Alertmanager. Arguments are bounded (1–10 matchers, at most
`APPROVAL_SILENCE_MAX_SECONDS`, refused before any approval is asked otherwise). The result is the new
silence's id and what it silences. Offered to AI Ops analyses only, while Alertmanager is configured
and ready (`available`); the request states who creates it, where, how long (`action`; docs/aiops.md).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.conf import settings
from django.utils import timezone

from agent.aiops import alertmanager
from agent.aiops.alertmanager import AlertmanagerClient
from agent.runtime.tools.registry import FLOW_AI_OPS, ToolArgumentsError, ToolResult, register_tool

MATCHERS_MAX = 10
CREATED_BY = "diagnosis agent (approved tool call)"


def max_minutes() -> int:
    """The longest silence the tool may create, in whole minutes (`APPROVAL_SILENCE_MAX_SECONDS`)."""
    return max(1, int(settings.APPROVAL_SILENCE_MAX_SECONDS) // 60)


def check_arguments(arguments: dict[str, Any]) -> None:
    """The bound the schema cannot state (it is a setting): the duration; raised as bad arguments."""
    if arguments["duration_minutes"] > max_minutes():
        raise ToolArgumentsError(
            f"arguments.duration_minutes must be ≤ {max_minutes()} (the configured maximum)"
        )
    if not any(m.get("isEqual", True) and m.get("value") for m in arguments["matchers"]):
        raise ToolArgumentsError("arguments.matchers must hold at least one equality matcher with a value")


def action(arguments: dict[str, Any]) -> dict[str, Any]:
    """What an approved call does, for the person asked: the silence is created as `CREATED_BY` (its
    `createdBy`) on the configured Alertmanager's host, and lasts `duration_minutes` from its creation."""
    return {
        "executedBy": CREATED_BY,
        "where": f"Alertmanager at {alertmanager.host() or '(not configured)'}",
        "lastsMinutes": int(arguments["duration_minutes"]),
    }


@register_tool(
    name="create_silence",
    description=(
        "Propose an Alertmanager silence for the alert being analysed: label matchers, a duration in "
        "minutes and a comment saying why. A person must approve it before it is created; until then the "
        "analysis waits. Only propose one when the alert text asks for a silence."
    ),
    parameters={
        "type": "object",
        "properties": {
            "matchers": {
                "type": "array",
                "maxItems": MATCHERS_MAX,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "minLength": 1, "maxLength": 100},
                        "value": {"type": "string", "maxLength": 200},
                        "isRegex": {"type": "boolean", "default": False},
                        "isEqual": {"type": "boolean", "default": True},
                    },
                    "required": ["name", "value"],
                    "additionalProperties": False,
                },
                "description": 'Label matchers, e.g. [{"name": "alertname", "value": "HighLatency"}].',
            },
            "duration_minutes": {"type": "integer", "minimum": 1, "maximum": 7 * 24 * 60},
            "comment": {"type": "string", "minLength": 1, "maxLength": 500},
        },
        "required": ["matchers", "duration_minutes", "comment"],
        "additionalProperties": False,
    },
    flows=(FLOW_AI_OPS,),
    requires_approval=True,
    check=check_arguments,
    available=alertmanager.unavailable,
    action=action,
)
def create_silence(matchers: list[dict[str, Any]], duration_minutes: int, comment: str) -> ToolResult:
    now = timezone.now()
    starts_at = now.isoformat()
    ends_at = (now + dt.timedelta(minutes=duration_minutes)).isoformat()
    silence_id = AlertmanagerClient.from_settings().create_silence(
        matchers=matchers, starts_at=starts_at, ends_at=ends_at, created_by=CREATED_BY, comment=comment
    )
    data = {
        "silenceId": silence_id,
        "matchers": matchers,
        "startsAt": starts_at,
        "endsAt": ends_at,
        "comment": comment,
    }
    return ToolResult(data=data, model_content=json.dumps(data, ensure_ascii=False))
