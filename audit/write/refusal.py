"""A run whose stored chain the service did not write: ended without another link.

When a process takes a run over (`RunRecorder.resume`: the sweeper, a resumption after approval, a
decision, a cancellation) and its chain's head does not authenticate (`audit.verify.authenticity`:
`ChainNotAuthentic`), nothing may be chained after it — a tag after a forged link would authenticate
the forgery — and nothing the chain says may be acted on. `end_unauthentic_run` ends the run FAILED
with `CHAIN_NOT_AUTHENTIC` on its row alone, under the caller's lease epoch (a conditional update, so a
newer claim is never overwritten): no event, no tool runs, and the checkpointer never anchors it
(`audit.transparency.gate` refuses it, and `verify_audit` names every link that does not
authenticate)."""

from __future__ import annotations

import logging

from django.utils import timezone

from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun, RunStatus

logger = logging.getLogger("audit.write")

CHAIN_NOT_AUTHENTIC = "CHAIN_NOT_AUTHENTIC"
RUN_NOT_AUTHENTIC = "RUN_NOT_AUTHENTIC"
RUN_REOPENED = "RUN_REOPENED"
MESSAGES = {
    RUN_REOPENED: (
        "The run's record already ends it but its row says it is open (the row's own terminal write failed, "
        "or a database writer reopened it): nothing more was recorded or executed. See verify_audit."
    ),
    CHAIN_NOT_AUTHENTIC: (
        "The run's recorded chain was not written by this service (its newest link carries no valid write "
        "tag): nothing more was recorded or executed. See verify_audit."
    ),
    RUN_NOT_AUTHENTIC: (
        "The run was not created by this service, or was changed since (its creation tag does not verify): "
        "nothing was executed. See verify_audit."
    ),
}


def end_unauthentic_run(
    run_id: str, *, lease_epoch: int | None = None, code: str = CHAIN_NOT_AUTHENTIC
) -> bool:
    """End the open run `run_id` FAILED without writing to its chain (see the module docstring): its chain
    does not authenticate (`CHAIN_NOT_AUTHENTIC`), already ends the run though its row was reopened
    (`RUN_REOPENED`: `ChainFinished`), or its row carries no valid creation tag
    (`RUN_NOT_AUTHENTIC`, `diagnosis.services.created_by_the_service`: a run a database writer inserted
    is never executed). With `lease_epoch`, only while the run still holds that epoch. Returns whether
    the row was updated."""
    rows = DiagnosisRun.objects.filter(run_id=run_id).exclude(status__in=TERMINAL_RUN_STATUSES)
    if lease_epoch is not None:
        rows = rows.filter(lease_epoch=lease_epoch)
    updated = rows.update(
        status=RunStatus.FAILED,
        error_code=code,
        error_message=MESSAGES[code],
        lease_owner="",
        lease_expires_at=None,
        finished_at=timezone.now(),
    )
    logger.error("run ended: its record does not authenticate run=%s code=%s", run_id, code)
    return bool(updated)
