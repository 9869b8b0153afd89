"""Reading reasoning content, on the record: the permission and second-factor check, the read's
access-log row and its chained `REASONING_READ` governance event (fail-closed: no unlogged read).

Keyword-only arguments. Log lines name ids and counts, never content.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import transaction

from access.stepup import OTP_MESSAGE, otp_satisfied
from audit.models import GovernanceEventType
from audit.verify import row_digests
from audit.write import record_governance_event
from reasoning.models import REASONING_PERMISSION, AccessChannel, ReasoningAccessLog
from reasoning.selectors import ReasoningRecord, get_reasoning_records
from reasoning.utils import client_address, user_agent

logger = logging.getLogger(__name__)

USER_AGENT_CHARS = 512


# --------------------------------------------------------------------------------------------------
# Reading reasoning, and the read-access log
# --------------------------------------------------------------------------------------------------
def read_reasoning(*, user: AbstractBaseUser, run: Any, request: Any, channel: str) -> list[ReasoningRecord]:
    """The reasoning records of `run` for `user`, with the read's access-log row written first.

    The caller has found `run` visible to `user` and checked `REASONING_PERMISSION` at the point its
    contract orders it; this checks it again (PermissionDenied), so no path reads unguarded. The row
    records who read what from where (`request`: its client address and user agent, `channel`: API or
    ADMIN). If that write fails, the exception propagates and nothing is returned (no unlogged read).
    With `REASONING_REQUIRE_OTP` on, the request must also carry a verified second factor
    (`access.stepup.otp_satisfied`; PermissionDenied otherwise).
    """
    if not (user.is_active and user.has_perm(REASONING_PERMISSION)):
        raise PermissionDenied
    if not otp_satisfied(request):
        raise PermissionDenied(OTP_MESSAGE)
    records = get_reasoning_records(run_id=run.run_id)
    record_reasoning_read(
        user=user,
        session_id=run.session_id,
        run_id=run.run_id,
        records_returned=len(records),
        client_address=client_address(request),
        user_agent=user_agent(request),
        channel=channel,
    )
    return records


def record_reasoning_read(
    *,
    user: AbstractBaseUser,
    session_id: str,
    run_id: str,
    records_returned: int,
    client_address: str | None,
    user_agent: str,
    channel: str = AccessChannel.API,
) -> ReasoningAccessLog:
    """Write the one access-log row of a successful reasoning read, and its REASONING_READ governance
    event binding the row's digest, in one transaction. Call it before the content leaves the process:
    if this write fails, the caller must not return the content (no unlogged read).

    `client_address` is stored only when it is a valid IPv4/IPv6 address (else NULL); the user agent is
    cut at 512 characters; `username` is a snapshot that survives the account's removal.
    """
    if channel not in AccessChannel.values:
        raise ValueError(f"unknown access channel {channel!r}")
    with transaction.atomic():
        entry = ReasoningAccessLog.objects.create(
            user=user,
            username=user.get_username(),
            session_id=session_id,
            run_id=run_id,
            records_returned=records_returned,
            channel=channel,
            client_address=_valid_ip(client_address),
            user_agent=(user_agent or "")[:USER_AGENT_CHARS],
        )
        entry.refresh_from_db()  # the row as stored (the digest covers what the database gives back)
        # Chained with the row (fail-closed: no read without its event), so that a deleted or edited
        # row of the access log is named by verify_audit (`audit.verify.access_log`).
        record_governance_event(
            event_type=GovernanceEventType.REASONING_READ,
            actor=entry.username,
            subject_user=entry.username,
            permission=REASONING_PERMISSION,
            details={"logId": entry.pk, "runId": run_id, "readDigest": row_digests.READ.digest_of(entry)},
        )
    logger.info(
        "reasoning read user=%s run=%s records=%d channel=%s",
        user.pk,
        run_id,
        records_returned,
        channel,
    )
    return entry


def _valid_ip(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None
