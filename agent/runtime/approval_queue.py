"""The read side of human approvals (`agent.runtime.approvals` decides): the tool calls that wait for a
decision, for the approvers' lists (API `GET /api/diagnosis/approvals/`, the admin's approvals page)
and a run's page. Each item carries the deadline by the one rule (`approvals.expiry_of`), the digest
of the arguments a decider must send back and what the request stated the action will be (who executes
it, where, until when: `approval_checks.statement`); who sees which runs is `diagnosis.selectors.visibility`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from agent.runtime.approval_checks import statement
from agent.runtime.approvals import expiry_of, may_approve
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.write import arguments_digest
from diagnosis.models import RunPurpose, RunStatus
from diagnosis.selectors import visibility


@dataclass(frozen=True, slots=True)
class WaitingApproval:
    run_id: str
    session_id: str
    tool_call_id: str
    tool_name: str
    arguments: Any
    arguments_digest: str
    requester: str
    requested_at: dt.datetime
    expires_at: dt.datetime
    # Who executes it, where, before when and until when its effect lasts (None: the request stated
    # nothing, e.g. one recorded before requests said so).
    action: dict[str, Any] | None = None


def _stated_actions(run_ids: set[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """The `action` each APPROVAL_REQUESTED of these runs stated, by (run, call); the latest wins."""
    stated: dict[tuple[str, str], dict[str, Any]] = {}
    events = TraceEvent.objects.filter(run_id__in=run_ids, event_type=EventType.APPROVAL_REQUESTED)
    for run_id, details in events.order_by("sequence_no").values_list("run_id", "details"):
        if isinstance(details, dict) and isinstance(details.get("action"), dict):
            stated[(run_id, str(details.get("toolCallId")))] = details["action"]
    return stated


def waiting_approvals(*, user: AbstractBaseUser, limit: int = 100) -> list[WaitingApproval]:
    """The calls waiting for a decision in runs `user` may see (`visibility`: own runs; staff and
    superusers: all), oldest first; empty for a user who may not decide. Reads the waiting rows by their
    status index."""
    if not may_approve(user):
        return []
    rows = ToolInvocation.objects.filter(
        visibility(user=user, session_path="run__session"),
        status=ToolStatus.AWAITING_APPROVAL,
        run__status=RunStatus.INTERRUPTED,
        run__purpose=RunPurpose.PRODUCTION,  # a replay never asks (agent.runtime.replay); none is listed
    ).order_by("created_at", "id")
    rows = list(
        rows.values(
            "run_id",
            "session_id",
            "tool_call_id",
            "tool_name",
            "input_params",
            "created_at",
            "run__session__owner__username",
        )[:limit]
    )
    stated = _stated_actions({r["run_id"] for r in rows})
    return [
        WaitingApproval(
            run_id=r["run_id"],
            session_id=r["session_id"],
            tool_call_id=r["tool_call_id"],
            tool_name=r["tool_name"],
            arguments=r["input_params"],
            arguments_digest=arguments_digest(r["input_params"]),
            requester=r["run__session__owner__username"] or "",
            requested_at=r["created_at"],
            expires_at=expiry_of(r["created_at"]),
            action=statement(stated.get((r["run_id"], r["tool_call_id"])), expiry_of(r["created_at"])),
        )
        for r in rows
    ]


def waiting_in_run(*, run_id: str) -> list[WaitingApproval]:
    """The calls of one run that wait for a decision (the run page's buttons; the caller found the run
    visible)."""
    rows = list(
        ToolInvocation.objects.filter(run_id=run_id, status=ToolStatus.AWAITING_APPROVAL).order_by(
            "created_at", "id"
        )
    )
    stated = _stated_actions({run_id}) if rows else {}
    return [
        WaitingApproval(
            run_id=t.run_id,
            session_id=t.session_id,
            tool_call_id=t.tool_call_id,
            tool_name=t.tool_name,
            arguments=t.input_params,
            arguments_digest=arguments_digest(t.input_params),
            requester="",
            requested_at=t.created_at,
            expires_at=expiry_of(t.created_at),
            action=statement(stated.get((t.run_id, t.tool_call_id)), expiry_of(t.created_at)),
        )
        for t in rows
    ]
