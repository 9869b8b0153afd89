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

from agent.runtime.cancel import CancelToken

logger = logging.getLogger(__name__)

_draining = False
_late: dict[asyncio.Task, CancelToken] = {}  # launched_while_draining; emptied by each drain


def draining() -> bool:
    """Whether this process is draining (see the module docstring)."""
    return _draining


def begin() -> None:
    """Mark the process draining (idempotent): new requests and runs are refused from now on."""
    global _draining
    _draining = True


def launched_while_draining(task: asyncio.Task, token: CancelToken) -> None:
    """`supervisor.launch` of a run after the drain began (a request already past the draining check):
    the drain counts and waits for it with the runs it found, even one that has ended before it looks."""
    _late[task] = token


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
    _late.clear()
    begin()
    # Every run this process executes during the drain, including those launched after it began (a
    # request already past the draining check; `supervisor.launch` asks them to hand over at once).
    # Without them, such a run went on here unseen, was cut off by the process's exit and failed
    # LEASE_EXPIRED when its lease ran out (a rolling-restart test's run, 2026-12-07).
    owned: dict[asyncio.Task, CancelToken] = {}

    def running() -> set[asyncio.Task]:
        owned.update(supervisor.owned_runs())
        owned.update(_late)
        return {t for t in owned if not t.done()}

    await supervisor.stop_claiming()
    at_start = len(running())
    logger.info("draining: %d run(s) executing, grace %.0f s", at_start, grace)
    await _wait(running(), grace)
    left = running()
    for task in left:
        owned[task].request_handover()
    await _wait(left, window)
    left = running()
    for task in left:
        owned[task].cut_streams()
    cut = len(left)
    await _wait(left, window)
    left = running()
    handed_over = sum(1 for task in owned if task.done() and _handed_over(task))
    report = DrainReport(
        finished=len(owned) - handed_over - len(left),
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
