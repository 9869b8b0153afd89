"""Draining a serving process: a deploy or a restart that no chat notices (issue 48).

`python -m config.serve` calls `drain()` on SIGTERM, before anything stops:

1. the process is *draining* (`draining()`): `/healthz` answers 503 `draining`, every new HTTP request
   503 `service_draining` with `Retry-After` and `Connection: close` (nginx sends it to the other
   process: `proxy_next_upstream … http_503 non_idempotent`; nothing was done), a new WebSocket is
   closed 1012 (service restart), and the listening sockets close, so new connections go elsewhere;
   connections already open (streams following runs) stay;
2. it claims nothing more (the queue worker and the adoption of handed-over runs stop) and lets its
   runs finish for `RUN_DRAIN_GRACE_SECONDS`;
3. then every run still executing is asked to hand over (`CancelToken.request_handover`): it stops
   before its agent's next model step, or once the tools of its current step have ended, saves its
   state as an interruption does (encrypted, its digest chained) and is PENDING again with RUN_INTERRUPTED
   `handover: true` (`RunRecorder.hand_over`); another process claims it within
   `RUN_ADOPT_INTERVAL_SECONDS` under a new lease epoch and continues it: no model call repeated, no
   tool executed twice, its followers' streams carry on from the new owner's frames;
4. after `RUN_HANDOVER_WINDOW_SECONDS`, a model stream still in progress is cut (`cut_streams`): that
   step is recorded abandoned (`finishReason: handover`) and the next owner asks the model again
   (`retriedStep` in the handover's record). A router, planner or guard call, and the release, are not
   cut: those runs finish here (or, if the process is killed first, their lease lapses and the sweeper
   fails them as before).

Then the server stops as before (`supervisor.shutdown`). Details: docs/deployment.md, *Draining restarts*.
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
