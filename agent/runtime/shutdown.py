"""A serving process's last steps, bounded: each stage of `supervisor.shutdown` (stop the background
duties, close the model clients, close the MCP sessions) gets what is left of `SHUTDOWN_SECONDS`, and
at least `STAGE_FLOOR_SECONDS` (so the MCP sessions are still closed after a stage that hung); a
stage that has not ended by then is cancelled and left behind, and a warning names it and where every
task it waits on is suspended (file:line of each coroutine in the await chain; never an argument or a
value), so the process still exits and the log says what held it. Without a bound, one await that never
returned kept a drained daphne alive until its supervisor's SIGKILL (docs/deployment.md, *Draining
restarts*).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

SHUTDOWN_SECONDS = 10.0  # all stages together; systemd's TimeoutStopSec leaves this after the drain
STAGE_FLOOR_SECONDS = 1.0  # a stage after one that used the whole bound still gets this much
_ROOT = str(Path(__file__).resolve().parents[2]) + "/"
_LIBRARY = re.compile(r".*/(?:site-packages|dist-packages|lib/python\d+\.\d+)/")


class Deadline:
    """`seconds` from now on the monotonic clock; `left()` never below 0."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())


async def bounded(stage: str, step: Awaitable[None], deadline: Deadline, *, watch: Iterable = ()) -> bool:
    """Await `step` until `deadline` (at least `STAGE_FLOOR_SECONDS`); True when it ended (an exception
    it raised is logged by class and counts as ended). Past the deadline the step is cancelled and not
    awaited again, and a warning names `stage` and where the step and every unfinished task of `watch`
    are suspended."""
    task = asyncio.ensure_future(step)
    if isinstance(task, asyncio.Task):
        task.set_name(stage)
    done, _ = await asyncio.wait({task}, timeout=max(deadline.left(), STAGE_FLOOR_SECONDS))
    if done:
        if not task.cancelled() and task.exception() is not None:
            logger.warning("shutdown: %s failed error=%s", stage, type(task.exception()).__name__)
        return True
    logger.warning("shutdown: %s did not end in time; left behind: %s", stage, describe_tasks((task, *watch)))
    task.cancel()
    return False


def awaiting(task: asyncio.Future) -> str:
    """Where `task` is suspended: file:line of each coroutine down its await chain, innermost last
    (`-` for a plain future)."""
    where: list[str] = []
    current: object = task
    while isinstance(current, asyncio.Task) and len(where) < 24:
        step: object = current.get_coro()
        while step is not None and len(where) < 24:
            frame = getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None)
            if frame is not None:
                where.append(f"{_short(frame.f_code.co_filename)}:{frame.f_lineno}")
            step = getattr(step, "cr_await", None) or getattr(step, "gi_yieldfrom", None)
        current = getattr(current, "_fut_waiter", None)  # the future it waits on: another task, followed
    return " > ".join(where) or "-"


def describe_tasks(tasks: Iterable[asyncio.Future], *, limit: int = 20) -> str:
    """`name at where` of up to `limit` unfinished tasks (`awaiting`), and how many more there were."""
    waiting = [t for t in tasks if not t.done()]
    text = "; ".join(f"{_name(t)} at {awaiting(t)}" for t in waiting[:limit])
    more = len(waiting) - limit
    return (text + (f"; and {more} more" if more > 0 else "")) or "none"


def _name(task: asyncio.Future) -> str:
    return task.get_name() if isinstance(task, asyncio.Task) else type(task).__name__


def _short(path: str) -> str:
    """A code path as a reader finds it: from the checkout's root, a library's package or the standard
    library's directory."""
    if path.startswith(_ROOT):
        return path[len(_ROOT) :]
    found = _LIBRARY.match(path)
    return path[found.end() :] if found else path
