"""Cancellation of a run: an in-process token checked at safe points and raced against long waits.

A `CancelToken` is set by whoever wants the run to stop: the transport (a `cancel` frame in this process),
or the executor's heartbeat when it reads the run's `cancel_requested` column (a cancel sent to another
process) or finds its lease taken. Stages call `raise_if_cancelled()` at safe points and wrap long waits
(model streams, tool executions) in `race()`, so that a cancel interrupts them at once. A handover is not a
cancel: `request_handover` asks the agent loop to stop at its next step boundary, `cut_streams` cuts a
model stream raced with `cuttable=True` (`StreamCut`). Details: docs/runtime.md, *Cancellation*, *Handover*.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class RunCancelled(Exception):
    """The run was cancelled (or lost its lease); raised at a safe point or out of a raced wait."""

    def __init__(self, reason: str = "cancel requested") -> None:
        super().__init__(reason)
        self.reason = reason


class StreamCut(Exception):
    """A model stream raced with `cuttable=True` was cut because the process hands the run over."""


class CancelToken:
    """A one-way latch: once cancelled it stays cancelled. Use it from the event loop that runs the run.

    `lease_lost` is set when the executor's heartbeat found another process owning the run: the run then
    stops without writing its terminal state (the new owner writes it).
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason = ""
        self.lease_lost = False
        self.handover_requested = False
        self._cut = asyncio.Event()

    def request_handover(self) -> None:
        """The process drains: stop at the next step boundary and hand the run over (see the module
        docstring). Never undone; a cancel still wins over it."""
        self.handover_requested = True

    def cut_streams(self) -> None:
        """The handover window is over: a cuttable wait in progress (a model stream) stops now."""
        self.handover_requested = True
        self._cut.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "cancel requested", *, lease_lost: bool = False) -> None:
        if not self._event.is_set():
            self.reason = reason
            self.lease_lost = lease_lost
            self._event.set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise RunCancelled(self.reason)

    async def wait(self) -> None:
        await self._event.wait()

    async def race(self, awaitable: Awaitable[T], *, cuttable: bool = False) -> T:
        """Await `awaitable`; if the token fires first, cancel it, wait for it to unwind and raise
        RunCancelled. Already cancelled, a coroutine given is closed unstarted (never left un-awaited).
        `cuttable`: `cut_streams` stops it too, raising `StreamCut` (a cancel takes precedence)."""
        cut = cuttable and self._cut.is_set()
        if self.cancelled or cut:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            if self.cancelled:
                raise RunCancelled(self.reason)
            raise StreamCut()
        task = asyncio.ensure_future(awaitable)
        waiters = {asyncio.ensure_future(self._event.wait())}
        if cuttable:
            waiters.add(asyncio.ensure_future(self._cut.wait()))
        try:
            await asyncio.wait({task, *waiters}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            for waiter in waiters:
                waiter.cancel()
            raise
        for waiter in waiters:
            waiter.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if self.cancelled:
            raise RunCancelled(self.reason)
        raise StreamCut()
