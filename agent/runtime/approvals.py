"""Human approval of risky tool calls (seed 002): request, decide, expire, cancel while waiting, resume.

A tool that `requires_approval` is never executed when the model calls it: the call is recorded waiting
(`approval_request`), the run's state saved (`agent.runtime.resume_state`) and the run INTERRUPTED.
`decide` is the one way a decision is made (API, admin, chat page; `expire_due` for the sweeper): under a
new fencing epoch, so two decisions never both land, and never at or after the recorded deadline
(`expiry_of`, `ApprovalExpired`); it makes the run PENDING for a worker to resume. `cancel_waiting` ends a
waiting run. This module is the write side; `agent.runtime.approval_queue` reads what waits for whom.
Details: docs/aiops.md, *Approvals*.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agent.runtime.canonical import CanonicalStore
from agent.runtime.resume_state import forget_checkpoint
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.authority import governance_position, permitted
from audit.write import ChainNotAuthentic, RunRecorder, arguments_digest, end_unauthentic_run
from core.groups import APPROVERS
from diagnosis.models import APPROVE_PERMISSION, ChatSession, DiagnosisRun, RunStatus

logger = logging.getLogger(__name__)

APPROVERS_GROUP = APPROVERS
APPROVED = "APPROVED"
REJECTED = "REJECTED"
EXPIRED = "EXPIRED"
DECISIONS = {"approve": APPROVED, "reject": REJECTED}
APPROVAL_CANCELLED = "APPROVAL_CANCELLED"
NOTE_CHARS = 1000


def timeout_seconds() -> int:
    return int(settings.APPROVAL_TIMEOUT_SECONDS)


def self_approval_allowed() -> bool:
    return bool(settings.APPROVAL_ALLOW_SELF)


# ---------------------------------------------------------------------------------------------------
# The deadline (the one home of the rule: the request, the lists, the decision and the sweeper use it)
# ---------------------------------------------------------------------------------------------------
def expiry_of(requested_at: dt.datetime) -> dt.datetime:
    """When a request made at `requested_at` (its waiting row's `created_at`, which is also the instant
    APPROVAL_REQUESTED's `expiresAt` is computed from) expires: `APPROVAL_TIMEOUT_SECONDS` later. A
    decision is accepted strictly before this instant; at or after it the call is expired."""
    return requested_at + dt.timedelta(seconds=timeout_seconds())


def is_expired(requested_at: dt.datetime, *, now: dt.datetime) -> bool:
    """Whether a request made at `requested_at` can no longer be approved or rejected at `now`."""
    return now >= expiry_of(requested_at)


def expired_if_requested_by(now: dt.datetime) -> dt.datetime:
    """The latest request time that is expired at `now` (`is_expired(t, now=now)` ⇔ `t <=` this): the
    same rule as a bound the sweeper can give SQL."""
    return now - dt.timedelta(seconds=timeout_seconds())


def approval_request(*, session_id: str) -> tuple[dict[str, Any], Any]:
    """Who may decide a call of the run in `session_id`, as APPROVAL_REQUESTED records it, and the
    deadline rule (`expiry_of`), which the recorder applies to the waiting row's own creation time so
    that the recorded `expiresAt` is exactly the instant decisions are held to."""
    requester = (
        ChatSession.objects.filter(session_id=session_id).values_list("owner__username", flat=True).first()
        or ""
    )
    approvers = {
        "permission": APPROVE_PERMISSION,
        "group": APPROVERS_GROUP,
        "requester": requester,
        "selfApproval": self_approval_allowed(),
    }
    return approvers, expiry_of


# ---------------------------------------------------------------------------------------------------
# Deciding
# ---------------------------------------------------------------------------------------------------
class ApprovalError(Exception):
    """A decision refused; `status` is the HTTP status the API answers, `code` the error code."""

    status = 409
    code = "conflict"

    def __init__(self, message: str, *, code: str | None = None, decided: Decided | None = None) -> None:
        super().__init__(message)
        self.code = code or type(self).code
        # A refusal that itself recorded something (an expiry): callers tell connected clients of it.
        self.decided = decided


class ApprovalNotFound(ApprovalError):
    status = 404
    code = "not_found"


class ApprovalForbidden(ApprovalError):
    status = 403
    code = "permission_denied"


class ApprovalConflict(ApprovalError):
    status = 409
    code = "conflict"


class ApprovalExpired(ApprovalError):
    """The request's deadline (`expiry_of`) had passed when the decision was attempted: refused, and
    the call is recorded as expired (APPROVAL_DECIDED EXPIRED, as the sweeper would have), unless an
    expiry was recorded already."""

    status = 409
    code = "expired"


class ApprovalUnavailable(ApprovalError):
    status = 503
    code = "service_unavailable"


@dataclass(frozen=True, slots=True)
class Decided:
    run_id: str
    tool_call_id: str
    decision: str
    decided_by: str
    arguments_digest: str
    sequence_no: int


def may_approve(user: AbstractBaseUser) -> bool:
    """`diagnosis.approve_tool_call` by the database and by the governance chain
    (`audit.verify.authority.permitted`): a right given outside the application confers nothing."""
    return bool(user.is_authenticated and permitted(user, APPROVE_PERMISSION))


def approver_still_permitted(username: str) -> bool:
    """Whether the person who approved a call still holds the approval right now (the database and the
    governance chain), checked again right before the approved call executes."""
    user = get_user_model().objects.filter(username=username).first() if username else None
    return user is not None and may_approve(user)


def decider_owner(username: str) -> str:
    return f"approval:{username or 'system'}"[:128]


def decide(
    *,
    run: DiagnosisRun,
    tool_call_id: str,
    decision: str,
    user: AbstractBaseUser | None,
    note: str = "",
    arguments_digest_seen: str | None = None,
) -> Decided:
    """Decide the waiting call `tool_call_id` of `run` (already found visible to `user` by the caller):
    `decision` APPROVED or REJECTED by `user`, or EXPIRED with `user=None` (the sweeper).

    Refused: without the permission (`ApprovalForbidden`), approving one's own run's request unless
    `APPROVAL_ALLOW_SELF` (`ApprovalForbidden`, code `self_approval`), an unknown call (`ApprovalNotFound`),
    a call whose expiry is recorded already (`ApprovalExpired`), a call not waiting — decided already, or
    the run not interrupted (`ApprovalConflict`, `not_waiting`), arguments whose digest is not the one the
    client saw or no longer the recorded one (`ApprovalConflict`, `arguments_changed`). A decision whose
    event did not commit does not stand (`ApprovalUnavailable`).

    The deadline is checked under the run's claim, at the instant the decision is recorded with
    (`decidedAt`): an APPROVED or REJECTED decision at or after `expiry_of(requested_at)` is not
    recorded as such; the call's expiry is recorded instead (APPROVAL_DECIDED EXPIRED, `decidedBy`
    null, no note: what `expire_due` records, and the run resumes to refuse the call) and
    `ApprovalExpired` is raised carrying that decision (`.decided`), whatever the sweeper's schedule.
    So no accepted decision has a `decidedAt` at or after the recorded `expiresAt`."""
    username = user.get_username() if user is not None else ""
    if user is not None and not may_approve(user):
        raise ApprovalForbidden("You may not decide tool calls (diagnosis.approve_tool_call).")
    tool = ToolInvocation.objects.filter(run_id=run.run_id, tool_call_id=tool_call_id).first()
    if tool is None:
        raise ApprovalNotFound("No such tool call waits in this run.")
    requested = (
        TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.APPROVAL_REQUESTED)
        .filter(details__toolCallId=tool_call_id)
        .order_by("-sequence_no")
        .values("sequence_no", "details")
        .first()
    )
    if requested is None:
        raise ApprovalNotFound("No approval was requested for this tool call.")
    requested_digest = str((requested["details"] or {}).get("argumentsDigest") or "")
    if decision == APPROVED and user is not None and not self_approval_allowed():
        requester = str(((requested["details"] or {}).get("approvers") or {}).get("requester") or "")
        if requester and requester == username:
            raise ApprovalForbidden(
                "The requester of a run may not approve its own request.", code="self_approval"
            )
    prior = _prior_decision(run.run_id, tool_call_id, after=requested["sequence_no"])
    if prior == EXPIRED:
        raise ApprovalExpired(_expired_message(tool.created_at, recorded_already=True))
    if tool.status != ToolStatus.AWAITING_APPROVAL or run.status != RunStatus.INTERRUPTED:
        raise ApprovalConflict("The tool call is not waiting for a decision.", code="not_waiting")
    stored_digest = arguments_digest(tool.input_params)
    if stored_digest != requested_digest or (
        arguments_digest_seen is not None and arguments_digest_seen != requested_digest
    ):
        raise ApprovalConflict(
            "The arguments differ from the ones the approval was requested for.", code="arguments_changed"
        )
    if prior is not None:
        raise ApprovalConflict("The tool call was decided already.", code="not_waiting")
    with transaction.atomic():
        epoch = _claim_interrupted(run, owner=decider_owner(username))
        if epoch is None:
            raise ApprovalConflict("The tool call is not waiting for a decision.", code="not_waiting")
        # Under the claim: no other decision can land now, so the instant read here is the decision's.
        decided_at = timezone.now()
        late = decision != EXPIRED and is_expired(tool.created_at, now=decided_at)
        recorded, decided_by = (EXPIRED, "") if late else (decision, username)
        try:
            recorder = RunRecorder.resume(run.run_id, lease_epoch=epoch)
        except ChainNotAuthentic:
            transaction.set_rollback(True)
            raise ApprovalConflict(
                "The run's record was not written by this service; nothing was decided.",
                code="chain_not_authentic",
            ) from None
        try:
            seq = recorder.approval_decided(
                tool_call_id=tool_call_id,
                tool_name=tool.tool_name,
                decision=recorded,
                decided_by=decided_by,
                note="" if late else note[:NOTE_CHARS],
                arguments=tool.input_params,
                arguments_digest=stored_digest,
                requested_sequence_no=requested["sequence_no"],
                claimable_until=None if _others_waiting(run.run_id, tool_call_id) else _claimable_until(),
                decided_at=decided_at,
                governance_at=governance_position(),
            )
        except Exception:
            transaction.set_rollback(True)
            raise ApprovalUnavailable("The decision could not be recorded; nothing changed.") from None
    logger.info("tool call decided run=%s call=%s decision=%s", run.run_id, tool_call_id, recorded)
    decided = Decided(run.run_id, tool_call_id, recorded, decided_by, stored_digest, seq)
    if late:
        raise ApprovalExpired(_expired_message(tool.created_at, recorded_already=False), decided=decided)
    return decided


def _expired_message(requested_at: dt.datetime, *, recorded_already: bool) -> str:
    when = expiry_of(requested_at).isoformat()
    if recorded_already:
        return f"The approval request expired at {when}; its expiry is recorded (treated as rejected)."
    return (
        f"The approval request expired at {when}: the decision was not taken; the call is recorded as "
        "expired (treated as rejected) and the run continues without it."
    )


def publish_decision(decided: Decided) -> bool:
    """Tell the run's connected clients (its channel-layer group) that the call was decided: the APPROVAL
    progress frame of the committed APPROVAL_DECIDED; best effort (followers also catch up from the
    timeline). For synchronous callers (the API and admin views, the sweeper's expiry)."""
    from asgiref.sync import async_to_sync

    from agent.runtime.live import publish

    event = decision_event(decided)
    return event is not None and async_to_sync(publish)(decided.run_id, event)


def decision_event(decided: Decided):
    """The APPROVAL progress frame of a committed decision (the one mapping replay uses too)."""
    from agent.runtime.events import progress_of

    return progress_of(
        run_id=decided.run_id,
        event_type=EventType.APPROVAL_DECIDED,
        status=decided.decision,
        details={},
        sequence_no=decided.sequence_no,
    )


def _claimable_until() -> dt.datetime:
    """A decided run waits for a queue worker at most the queue timeout (then the sweeper fails it)."""
    from agent.runtime.sweeper import queue_timeout_seconds

    return timezone.now() + dt.timedelta(seconds=queue_timeout_seconds())


def _others_waiting(run_id: str, tool_call_id: str) -> bool:
    """Whether another call of the run still waits for a decision (the run resumes once all are)."""
    for other in (
        ToolInvocation.objects.filter(run_id=run_id, status=ToolStatus.AWAITING_APPROVAL)
        .exclude(tool_call_id=tool_call_id)
        .values_list("tool_call_id", flat=True)
    ):
        if _prior_decision(run_id, other, after=0) is None:
            return True
    return False


def _prior_decision(run_id: str, tool_call_id: str, *, after: int) -> str | None:
    """The decision (APPROVED, REJECTED, EXPIRED) recorded for the call after the request at `after`."""
    return (
        TraceEvent.objects.filter(run_id=run_id, event_type=EventType.APPROVAL_DECIDED, sequence_no__gt=after)
        .filter(details__toolCallId=tool_call_id)
        .order_by("-sequence_no")
        .values_list("status", flat=True)
        .first()
    )


def _claim_interrupted(run: DiagnosisRun, *, owner: str, decided: bool = False) -> int | None:
    """Take an INTERRUPTED run's lease to write a decision (or a cancel; `decided`: also a decided run
    no worker claimed yet): conditional on the status and the epoch as read, so of two writers one wins;
    the new epoch, or None."""
    until = timezone.now() + dt.timedelta(seconds=60)
    waiting = Q(status=RunStatus.INTERRUPTED)
    if decided:
        waiting |= Q(status=RunStatus.PENDING, started_at__isnull=False, lease_owner="")
    taken = DiagnosisRun.objects.filter(waiting, pk=run.pk, lease_epoch=run.lease_epoch).update(
        lease_owner=owner, lease_expires_at=until, lease_epoch=F("lease_epoch") + 1
    )
    return run.lease_epoch + 1 if taken else None


def expire_due(*, now: dt.datetime | None = None, limit: int = 100) -> list[Decided]:
    """Record EXPIRED for every call expired at `now` (`is_expired`: its deadline reached; treated as
    rejected: the resumed run gives the model the refusal); the sweeper's duty. A decision attempted
    after the deadline records the same expiry itself (`decide`), so the sweeper's schedule never lets
    a late decision land. Returns the decisions (the caller tells connected clients: `decision_event`)."""
    now = now or timezone.now()
    due = list(
        ToolInvocation.objects.filter(
            status=ToolStatus.AWAITING_APPROVAL, created_at__lte=expired_if_requested_by(now)
        )
        .order_by("created_at", "id")
        .values_list("run_id", "tool_call_id")[:limit]
    )
    expired = []
    for run_id, tool_call_id in due:
        run = DiagnosisRun.objects.filter(run_id=run_id, status=RunStatus.INTERRUPTED).first()
        if run is None:
            continue
        try:
            expired.append(decide(run=run, tool_call_id=tool_call_id, decision=EXPIRED, user=None))
        except ApprovalError as exc:  # decided meanwhile, or the record failed: next sweep
            logger.info("approval expiry skipped run=%s code=%s", run_id, exc.code)
    return expired


def is_waiting(run: DiagnosisRun) -> bool:
    """Whether nobody executes the run because it waits: INTERRUPTED, or decided and not yet claimed by a
    worker (PENDING again after it started, no lease owner)."""
    return run.status == RunStatus.INTERRUPTED or (
        run.status == RunStatus.PENDING and run.started_at is not None and not run.lease_owner
    )


def cancel_waiting(*, run: DiagnosisRun, reason: str = "cancel requested") -> bool:
    """Cancel a run that waits (`is_waiting`): under its own claim, close the pending calls INTERRUPTED
    (`APPROVAL_CANCELLED`: never executed, a refusal recorded), RUN_CANCELLED, RUN_FINISHED CANCELLED;
    then its saved state is dropped (`forget_checkpoint`).
    False when the run was not waiting any more (claimed, decided or cancelled meanwhile)."""
    epoch = _claim_interrupted(run, owner=decider_owner("cancel"), decided=True)
    if epoch is None:
        return False
    try:
        recorder = RunRecorder.resume(run.run_id, lease_epoch=epoch)
    except ChainNotAuthentic as refused:
        end_unauthentic_run(run.run_id, lease_epoch=epoch, code=refused.code)
        forget_checkpoint(CanonicalStore(run.run_id))
        return True
    recorder.close_tools(
        status=ToolStatus.INTERRUPTED,
        error_code=APPROVAL_CANCELLED,
        error_message="the run was cancelled while the call waited for approval; it was not made",
        awaiting=True,
    )
    recorder.run_cancelled(reason=reason)
    recorder.finish(status=RunStatus.CANCELLED)
    forget_checkpoint(CanonicalStore(run.run_id))
    return True
