"""A loop that receives from one channel of the channel layer until it is stopped (`Receiver`), and a
stop that ends it even where a cancellation is lost: on CPython 3.11 with redis-py's socket timeout, a
cancel landing as channels_redis writes its blocking pop is dropped (`asyncio.wait_for`) and the receive
pops on. `stop` sets a flag the loop reads after every receive, cancels, and when the task has not ended
after a short grace cancels again and wakes the receive with a message on its own channel. The control
listener and every run follower receive through it. Cause and measurements: docs/reliability.md, *Bugs
found and fixed*.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

WAKE_MESSAGE_TYPE = "receiver.wake"  # sent by `stop` to the receiver's own channel; never handled
GRACE_SECONDS = 0.05  # a cancellation that works ends the receive well within this
RECANCEL_SECONDS = 0.25  # then, while it has not ended: cancel again this often


class Receiver:
    """Receives messages from `channel` of `layer` and passes each to `handle` (synchronous; a wake-up
    message is never passed), until `stop`. A receive that raises is logged as `<what> receive failed
    error=<class>` and retried after `pause` seconds. `run` is the loop, awaited by the task that owns
    it; `stop` may be awaited by any task of the same event loop, once or more."""

    def __init__(
        self, layer: Any, channel: str, handle: Callable[[dict], None], *, what: str, pause: float
    ) -> None:
        self.layer, self.channel = layer, channel
        self._handle, self._what, self._pause = handle, what, pause
        self._stopping = False
        self._task: asyncio.Task | None = None

    async def run(self) -> None:
        self._task = asyncio.current_task()
        while not self._stopping:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    return
                logger.warning("%s receive failed error=%s", self._what, type(exc).__name__)
                await asyncio.sleep(self._pause)
                continue
            if self._stopping:
                return
            if message.get("type") != WAKE_MESSAGE_TYPE:
                self._handle(message)

    async def stop(self, timeout: float) -> bool:
        """End the loop within `timeout` seconds; True when it has ended (or never started)."""
        self._stopping = True
        task = self._task
        if task is None or task.done():
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=min(GRACE_SECONDS, timeout))
        woken = False
        while not done and (left := deadline - loop.time()) > 0:
            task.cancel()
            if not woken:
                woken = True
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.layer.send(self.channel, {"type": WAKE_MESSAGE_TYPE}), left)
            left = max(0.0, deadline - loop.time())
            done, _ = await asyncio.wait({task}, timeout=min(RECANCEL_SECONDS, left))
        if not done:
            logger.warning("%s receive did not stop within %.1f s", self._what, timeout)
        return bool(done)
