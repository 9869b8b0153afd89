"""A session's newest audit records (`get_session_audits`): its model steps and tool invocations across
its runs, newest `limit`, for the session audits API (`surfaces.api.audit`). Two queries; the steps' model
input and output columns are never read.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from audit.models import AgentStep, ToolInvocation

SESSION_AUDITS_LIMIT = 500

# agent_step columns the trace never shows (bounded metadata, but not part of the contract)
_STEP_DEFERRED = ("model_input", "model_output", "attempts", "tool_call_ids")


class AuditKind:
    MODEL_STEP = "MODEL_STEP"
    TOOL = "TOOL"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One model-step or tool record of a session; exactly one of `step` and `tool` is set."""

    kind: str
    run_id: str
    created_at: dt.datetime
    step: AgentStep | None = None
    tool: ToolInvocation | None = None


@dataclass(frozen=True, slots=True)
class SessionAudits:
    audits: list[AuditRecord]
    truncated: bool


def get_session_audits(*, session_id: str, limit: int = SESSION_AUDITS_LIMIT) -> SessionAudits:
    """The newest `limit` model-step and tool records across the session's runs, oldest first; two
    queries. `truncated` is true when the session holds more than `limit` such records."""
    steps = list(
        AgentStep.objects.filter(session_id=session_id)
        .defer(*_STEP_DEFERRED)
        .order_by("-created_at", "-id")[: limit + 1]
    )
    tools = list(
        ToolInvocation.objects.filter(session_id=session_id).order_by("-created_at", "-id")[: limit + 1]
    )
    records = [AuditRecord(AuditKind.MODEL_STEP, s.run_id, s.created_at, step=s) for s in steps] + [
        AuditRecord(AuditKind.TOOL, t.run_id, t.created_at, tool=t) for t in tools
    ]
    records.sort(key=lambda r: (r.created_at, r.kind == AuditKind.TOOL), reverse=True)
    truncated = len(records) > limit
    newest = records[:limit]
    newest.reverse()
    return SessionAudits(audits=newest, truncated=truncated)
