"""Draining a serving process on SIGTERM (`python -m config.serve` calls `drain()`): a deploy no chat notices.

The process is *draining* (`draining()`): `/healthz` 503 `draining`, new requests 503 `service_draining`,
new WebSockets closed 1012 (`supervisor.BackgroundDuties`); it claims nothing more (`stop_claiming`) and
lets its runs finish for `RUN_DRAIN_GRACE_SECONDS`; then each run still executing hands over at its
agent's next step boundary (`CancelToken.request_handover`: state saved as an interruption's, the run
PENDING for another process), and after `RUN_HANDOVER_WINDOW_SECONDS` a model stream still running is cut
(`cut_streams`: recorded abandoned, asked again by the next owner); tools, router, planner and guard calls
never are. Details: docs/deployment.md, *Draining restarts*; docs/runtime.md, *Handover*.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from django.conf import settings

logger = logging.getLogger(__name__)

_draining = False


def draining() -> bool:
    """Whether this process is draining (see the module docstring)."""
    return _draining


def begin() -> None:
    """Mark the process draining (idempotent): new requests and runs are refused from now on."""
    global _draining
    _draining = True


def reset() -> None:
    """Back to serving (tests, or a process whose drain was abandoned)."""
    global _draining
    _draining = False


@dataclass(frozen=True, slots=True)
class DrainReport:
    """How the drain went: runs that finished here, that were handed over at a boundary, whose stream
    was cut, and that were still executing when it gave up."""

    finished: int
    handed_over: int
    cut: int
    left: int
    seconds: float


async def _wait(tasks: set[asyncio.Task], seconds: float) -> set[asyncio.Task]:
    """Wait up to `seconds` for `tasks` to end; those still running."""
    pending = {t for t in tasks if not t.done()}
    if pending and seconds > 0:
        _done, pending = await asyncio.wait(pending, timeout=seconds)
    return {t for t in pending if not t.done()}


def _handed_over(task: asyncio.Task) -> bool:
    """Whether the run task ended by handing its run over (its outcome is PENDING)."""
    from diagnosis.models import RunStatus

    if task.cancelled() or task.exception() is not None:
        return False
    return getattr(task.result(), "status", None) == RunStatus.PENDING


async def drain(*, grace: float | None = None, window: float | None = None) -> DrainReport:
    """Drain this process (see the module docstring); returns what happened to its runs."""
    from agent.runtime import supervisor

    grace = float(settings.RUN_DRAIN_GRACE_SECONDS) if grace is None else grace
    window = float(settings.RUN_HANDOVER_WINDOW_SECONDS) if window is None else window
    began = time.monotonic()
    begin()
    await supervisor.stop_claiming()
    owned = supervisor.owned_runs()
    at_start = len(owned)
    logger.info("draining: %d run(s) executing, grace %.0f s", at_start, grace)
    left = await _wait(set(owned), grace)
    handing = {task: token for task, token in owned.items() if task in left}
    for token in handing.values():
        token.request_handover()
    left = await _wait(left, window)
    cut = 0
    for task in left:
        token = handing.get(task)
        if token is not None:
            token.cut_streams()
            cut += 1
    left = await _wait(left, window)
    handed_over = sum(1 for task in handing if task not in left and _handed_over(task))
    report = DrainReport(
        finished=at_start - handed_over - len(left),
        handed_over=handed_over,
        cut=cut,
        left=len(left),
        seconds=round(time.monotonic() - began, 3),
    )
    logger.info(
        "drained: finished=%d handed_over=%d streams_cut=%d still_running=%d seconds=%.1f",
        report.finished,
        report.handed_over,
        report.cut,
        report.left,
        report.seconds,
    )
    return report
