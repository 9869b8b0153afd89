"""The sweeper: fail runs whose executing process stopped renewing its lease, and close their tools.

`sweep_expired_runs` takes each run whose lease expired (or that nobody claimed in time) with a
conditional update on exactly the lease it observed, epoch included, so an owner that renewed meanwhile
or another sweeper wins instead; then, through a recorder fenced by the new epoch, it closes the run's
running tools and ends it FAILED `LEASE_EXPIRED` (a queued AI Ops run: `QUEUE_EXPIRED`, after
`AIOPS_QUEUE_TIMEOUT_SECONDS`). The old owner can land no row any more. `publish_swept` ends the runs'
followers at once. It runs in every server process and as `manage.py sweep_runs`.
Details: docs/chat.md, *Leases, the sweeper and fencing*.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from agent.runtime.db import db
from agent.runtime.live import persisted_frames, publish
from audit.models import ToolStatus
from audit.write import ChainNotAuthentic, RunRecorder, end_unauthentic_run
from diagnosis import services
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun, RunStatus

logger = logging.getLogger(__name__)

LEASE_EXPIRED = "LEASE_EXPIRED"
LEASE_EXPIRED_MESSAGE = "The process executing the run stopped before finishing it."
QUEUE_EXPIRED = "QUEUE_EXPIRED"
QUEUE_EXPIRED_MESSAGE = "No worker took the queued run in time (AIOPS_QUEUE_TIMEOUT_SECONDS)."
SWEEP_BATCH = 100


def sweeper_owner() -> str:
    return f"sweeper:{socket.gethostname()}:{os.getpid()}"[:128]


def queue_timeout_seconds() -> float:
    """How long a queued run may wait for a worker (`AIOPS_QUEUE_TIMEOUT_SECONDS`, default one hour)."""
    return float(settings.AIOPS_QUEUE_TIMEOUT_SECONDS)


def expired_runs(*, now: dt.datetime | None = None, limit: int = SWEEP_BATCH) -> list[DiagnosisRun]:
    """Active runs whose lease expired, or that nobody claimed within a lease period (one query)."""
    now = now or timezone.now()
    stale = now - dt.timedelta(seconds=services.lease_seconds())
    queue_stale = now - dt.timedelta(seconds=queue_timeout_seconds())
    queued = Q(agent_flow__in=services.QUEUED_FLOWS)
    never_claimed = Q(lease_expires_at__isnull=True)
    return list(
        DiagnosisRun.objects.filter(
            Q(lease_expires_at__lt=now)
            | (never_claimed & ~queued & Q(created_at__lt=stale))
            | (never_claimed & queued & Q(created_at__lt=queue_stale)),
            status__in=(RunStatus.PENDING, RunStatus.RUNNING),
        )
        .only("run_id", "status", "agent_flow", "lease_owner", "lease_expires_at", "lease_epoch")
        .order_by("lease_expires_at", "id")[:limit]
    )


def _claim(run: DiagnosisRun, now: dt.datetime) -> int | None:
    """Take the lease exactly as observed; the new lease epoch, or None when the run changed."""
    return services.claim_expired_run(run=run, owner=sweeper_owner(), now=now)


def fail_run(run_id: str, *, error_code: str, error_message: str, lease_epoch: int | None = None) -> bool:
    """Finish an open run FAILED through the recorder: note fenced writes, close its RUNNING tools
    (FAILED, `error_code`), write RUN_FINISHED and the terminal row. The caller must hold the run: the
    lease it claimed with `lease_epoch`, or its task (the stored epoch). Returns False when the run had
    already finished."""
    status = DiagnosisRun.objects.filter(run_id=run_id).values_list("status", flat=True).first()
    if status is None or status in TERMINAL_RUN_STATUSES:
        return False
    try:
        recorder = RunRecorder.resume(run_id, lease_epoch=lease_epoch)
    except ChainNotAuthentic as refused:  # not the service's chain, or it ended the run already
        return end_unauthentic_run(run_id, lease_epoch=lease_epoch, code=refused.code)
    recorder.note_fenced_writes()
    recorder.close_tools(status=ToolStatus.FAILED, error_code=error_code, error_message=error_message)
    recorder.finish(status=RunStatus.FAILED, error_code=error_code, error_message=error_message)
    return True


def sweep_expired_runs(*, now: dt.datetime | None = None, limit: int = SWEEP_BATCH) -> list[str]:
    """Fail every run whose lease expired (see the module docstring); returns the run ids swept."""
    now = now or timezone.now()
    swept = []
    for run in expired_runs(now=now, limit=limit):
        unserved = run.lease_expires_at is None and run.agent_flow in services.QUEUED_FLOWS
        code, message = (
            (QUEUE_EXPIRED, QUEUE_EXPIRED_MESSAGE) if unserved else (LEASE_EXPIRED, LEASE_EXPIRED_MESSAGE)
        )
        epoch = _claim(run, now)
        if epoch is None:
            continue
        try:
            if fail_run(run.run_id, error_code=code, error_message=message, lease_epoch=epoch):
                swept.append(run.run_id)
                logger.warning("run swept run=%s previous_owner=%s", run.run_id, run.lease_owner or "-")
        except Exception as exc:  # one bad run must not stop the sweep of the others
            logger.error("sweep failed run=%s error=%s", run.run_id, type(exc).__name__)
    return swept


async def publish_swept(run_ids: list[str]) -> None:
    """Send each swept run's final frames (`error`, `outcome`) to its live group; best effort."""
    for run_id in run_ids:
        replay = await db(persisted_frames, run_id, after=0)
        for live in replay.frames:
            if live.type in ("error", "outcome"):
                await publish(run_id, live)
