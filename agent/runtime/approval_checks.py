"""What an approval request states, and the checks an approved call passes right before it executes.

`statement(action, expires_at)` is what the person asked reads: who executes the call (the service's
identity), where (the backend's host), before when (the approval deadline) and, for an effect that lasts
(a silence), when it ends at the latest. `approved_call_problem(...)` is checked again just before an
approved call executes: the run still waits on that exact call and arguments, the target is still the
one stated, the deadline has not passed, the approver still holds the right; otherwise the call is not
made and its FAILED terminal says which failed (`APPROVAL_STALE`, `APPROVAL_DEADLINE_PASSED`,
`APPROVAL_REVOKED`). Details: docs/aiops.md, *Approvals*.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from django.utils import timezone

from agent.runtime.approvals import approver_still_permitted, expiry_of
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.write import arguments_digest

APPROVAL_STALE = "APPROVAL_STALE"
APPROVAL_DEADLINE_PASSED = "APPROVAL_DEADLINE_PASSED"
APPROVAL_REVOKED = "APPROVAL_REVOKED"


def _when(moment: dt.datetime) -> str:
    return f"{moment.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"


def statement(action: Mapping[str, Any] | None, expires_at: dt.datetime) -> dict[str, Any] | None:
    """What an approved call will do, for people (None when the request stated nothing): `executedBy`,
    `where`, `executeBefore` (the deadline: an approved call starts before it or never), `endsBy` (the
    latest end of a lasting effect, or None) and `text`, one sentence of all of it."""
    if not action:
        return None
    by, where = str(action.get("executedBy") or "the service"), str(action.get("where") or "")
    lasts = action.get("lastsMinutes")
    ends_by = expires_at + dt.timedelta(minutes=int(lasts)) if isinstance(lasts, int) else None
    text = (
        f"Executed by the service as “{by}”{f' on {where}' if where else ''}, only if approved and "
        f"started before {_when(expires_at)}."
    )
    if ends_by is not None:
        text += f" Its effect lasts {lasts} min from its creation: it ends by {_when(ends_by)} at the latest."
    return {
        "executedBy": by,
        "where": where,
        "executeBefore": expires_at,
        "endsBy": ends_by,
        "text": text,
    }


def requested_details(run_id: str, tool_call_id: str, sequence_no: Any) -> dict[str, Any]:
    """The APPROVAL_REQUESTED details an approval decided on (its `requestedAt` sequence number), else
    the call's latest request; {} when there is none."""
    events = TraceEvent.objects.filter(run_id=run_id, event_type=EventType.APPROVAL_REQUESTED)
    if isinstance(sequence_no, int):
        events = events.filter(sequence_no=sequence_no)
    details = (
        events.filter(details__toolCallId=tool_call_id)
        .order_by("-sequence_no")
        .values_list("details", flat=True)
        .first()
    )
    return details if isinstance(details, dict) else {}


def approved_call_problem(
    *,
    run_id: str,
    tool_call_id: str,
    decision: Mapping[str, Any],
    action_now: Callable[[], Mapping[str, Any] | None],
    now: dt.datetime | None = None,
) -> tuple[str, str] | None:
    """`(code, message)` of the first check an approved call fails right before it executes, or None.

    1. Still current (`APPROVAL_STALE`): the call's row still waits (AWAITING_APPROVAL) with the
       arguments whose digest was requested and approved, and the target the request stated (`where`)
       is the one the call would act on now (`action_now()`: e.g. the configured Alertmanager's host).
    2. In time (`APPROVAL_DEADLINE_PASSED`): before the request's recorded `expiresAt`.
    3. Still allowed (`APPROVAL_REVOKED`): the approver is active and holds `diagnosis.approve_tool_call`
       by the database and the governance chain."""
    now = now or timezone.now()
    row = ToolInvocation.objects.filter(run_id=run_id, tool_call_id=tool_call_id).first()
    requested = requested_details(run_id, tool_call_id, decision.get("requestedAt"))
    approved = str(decision.get("argumentsDigest") or "")
    if (
        row is None
        or row.status != ToolStatus.AWAITING_APPROVAL
        or not approved
        or arguments_digest(row.input_params) != approved
        or str(requested.get("argumentsDigest") or "") != approved
    ):
        return APPROVAL_STALE, "the run no longer waits on this call with the approved arguments"
    stated = str((requested.get("action") or {}).get("where") or "")
    try:
        current = str((action_now() or {}).get("where") or "")
    except Exception:  # the arguments no longer pass the tool's checks: nothing says where it would act
        current = ""
    if stated and stated != current:  # a request that stated no target (older ones) is not compared
        return APPROVAL_STALE, f"approved to act on {stated}, but it would act on {current or 'nothing'}"
    try:
        deadline = dt.datetime.fromisoformat(str(requested["expiresAt"]))
    except (KeyError, ValueError):
        deadline = expiry_of(row.created_at)
    if now >= deadline:
        return APPROVAL_DEADLINE_PASSED, (
            f"the approval deadline ({_when(deadline)}) passed before the call could start"
        )
    approver = str(decision.get("decidedBy") or "")
    if not approver_still_permitted(approver):
        return APPROVAL_REVOKED, (
            f"the approver ({approver or 'unknown'}) no longer holds diagnosis.approve_tool_call "
            "(by the database or the governance chain)"
        )
    return None
